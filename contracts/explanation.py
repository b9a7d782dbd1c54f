"""The explanation model: how many candidates each level of the scheduler saw, kept, and dropped for which reason.

One model answers placement, the dry-run `explain` endpoint and refusal messages alike, so "why is my allocation
pending?" always gets the same, countable answer. Every level obeys `considered == passed + sum(dropped)`; the
models refuse to be built otherwise. The scheduler counts a level with `scheduler.explanation.Tally`.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, model_validator

from contracts.reasons import Reason


class Level(StrEnum):
    TENANT = "tenant"
    REGION = "region"
    POOL = "pool"
    NODE = "node"
    BUNDLE = "bundle"


class ItemVerdict(BaseModel):
    """One candidate at one level: its name, why it was dropped (None: it passed), and what the scheduler saw."""

    model_config = ConfigDict(frozen=True)

    name: str
    reason: Reason | None
    detail: str


class LevelExplanation(BaseModel):
    model_config = ConfigDict(frozen=True)

    level: Level
    considered: int
    passed: int
    dropped: dict[Reason, int]
    summary: str
    items: list[ItemVerdict] | None = None  # per-item detail, only when asked for

    @model_validator(mode="after")
    def _counts_add_up(self) -> LevelExplanation:
        if self.considered != self.passed + sum(self.dropped.values()):
            raise ValueError(f"{self.level}: {self.considered} considered != {self.passed} passed + {self.dropped}")
        if self.items is not None and len(self.items) != self.considered:
            raise ValueError(f"{self.level}: {len(self.items)} items for {self.considered} considered")
        return self


class Explanation(BaseModel):
    """Levels in the order the request went through them; `summary` is the one line a user reads first."""

    model_config = ConfigDict(frozen=True)

    summary: str
    levels: list[LevelExplanation]

    def level(self, level: Level) -> LevelExplanation | None:
        return next((entry for entry in self.levels if entry.level is level), None)


class Refusal(BaseModel):
    """Why a request cannot be placed now: a stable code and the one line a user reads."""

    model_config = ConfigDict(frozen=True)

    code: Reason
    message: str
