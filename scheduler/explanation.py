"""Counting a level of the scheduler as it judges candidates, into the explanation model (`contracts/explanation.py`).

Every level obeys `considered == passed + sum(dropped)`, and its summary names the reasons by how many they dropped,
so "why is my allocation pending?" always gets the same, countable answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from contracts.explanation import ItemVerdict, Level, LevelExplanation
from contracts.reasons import Reason
from scheduler.reasons import phrase

_REASON_ORDER = {reason: position for position, reason in enumerate(Reason)}


class Tally:
    """Counts verdicts for one level as the scheduler judges candidates, then renders the level's explanation.

    Candidates may be recorded one at a time or as a group sharing one verdict (nodes with identical profiles);
    the per-item detail is only built when asked for, because building it is the one O(candidates) step.
    """

    def __init__(self, level: Level, noun: str, goal: str, gpu_count: int, detail: bool) -> None:
        self.level = level
        self.noun = noun
        self.goal = goal
        self.gpu_count = gpu_count
        self.detail = detail
        self.considered = 0
        self.passed = 0
        self.dropped: dict[Reason, int] = {}
        self.items: list[ItemVerdict] = []

    def record(
        self, reason: Reason | None, names: Sequence[str], describe: Callable[..., str] | None = None, *context: object
    ) -> None:
        """Count `names` under `reason` (None: passed). `describe(*context)` is the per-item detail, called only
        when detail was asked for (passing context rather than a closure keeps the hot loop allocation-free)."""
        if not names:
            return
        self._count(reason, len(names))
        if self.detail:
            text = describe(*context) if describe is not None else ""
            self.items.extend(ItemVerdict(name=name, reason=reason, detail=text) for name in names)

    def add(self, reason: Reason | None, count: int) -> None:
        """Count `count` candidates under `reason` (None: passed) without naming them: only when no detail was asked
        for, where `record` would look at nothing but how many names it was given."""
        assert not self.detail, "per-item detail needs the names: use record"
        if count > 0:
            self._count(reason, count)

    def _count(self, reason: Reason | None, count: int) -> None:
        self.considered += count
        if reason is None:
            self.passed += count
        else:
            self.dropped[reason] = self.dropped.get(reason, 0) + count

    def explanation(self) -> LevelExplanation:
        ordered = dict(sorted(self.dropped.items(), key=lambda entry: (-entry[1], _REASON_ORDER[entry[0]])))
        summary = f"{self.passed}/{self.considered} {self.noun} {self.goal}"
        if ordered:
            summary += ": " + ", ".join(phrase(reason, count, self.gpu_count) for reason, count in ordered.items())
        return LevelExplanation(
            level=self.level,
            considered=self.considered,
            passed=self.passed,
            dropped=ordered,
            summary=summary,
            items=self.items if self.detail else None,
        )
