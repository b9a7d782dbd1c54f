"""What a node agent tells the control plane about its host, and what it hears back: the report contract.

Shared by the agent (which sends it), the API (which checks it) and the store (which keeps it), so both ends agree on
its shape. An agent sends its whole `HostInventory` only when its topology hash moved or when the control plane asks
(`send_host`); otherwise a report is a heartbeat of a few dozen bytes. The reply carries the node's approved slots
whenever the agent's copy is out of date (`approved` differs), so an agent plans with exactly the slots the operator
approved, without database credentials or a copy of the fleet file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.node import Slot
from scheduler.host.checks import NodeValidation
from scheduler.host.health import SlotHealth
from scheduler.host.inventory import MAX_GPUS, HostInventory

HASH = r"^[0-9a-f]{1,16}$"


class AgentInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(max_length=64, pattern=r"^[\x20-\x7e]*$", description="The agent's software version.")
    interval_seconds: float = Field(ge=1.0, le=3600.0, description="How often the agent reports.")


class NodeReport(BaseModel):
    """What an agent sends, on start, when its host changes, and every interval."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: AgentInfo
    topology: str = Field(pattern=HASH, description="`HostInventory.topology_hash()` of the host now.")
    approved: str | None = Field(
        default=None, pattern=HASH, description="The hash of the approved slots the agent plans with (None: none)."
    )
    host: HostInventory | None = Field(
        default=None, description="The whole inventory: on start, when the topology changed, or when asked for it."
    )
    health: list[SlotHealth] | None = Field(
        default=None,
        max_length=MAX_GPUS,
        description="Each approved slot's health verdict: on start, and whenever one changed.",
    )


class ReportReply(BaseModel):
    model_config = ConfigDict(frozen=True)

    node: str
    live: bool
    send_host: bool = False  # the control plane lacks this topology: report again with `host`
    send_health: bool | None = None  # True: a slot was repaired since the agent's last verdicts: send them again
    approved: str  # the hash of the node's approved slots now
    slots: list[dict[str, Any]] | None = None  # the approved slots (fleet-file form), when the agent's hash differs
    validation: NodeValidation | None = None  # the verdicts stored, when this report computed them
    # Why this report put the node in DRAINING: a GPU's driver asked for what only a drain repairs (a node reboot, a
    # drain and reset). None: it did not, or the node was draining already (or DOWN, the fleet file's to change).
    drained: str | None = None


def approved_hash(slots: Iterable[Slot]) -> str:
    """Identifies one node's approved inventory: the agent and the control plane compare it instead of the slots."""
    documents = [slot.model_dump(mode="json", by_alias=True) for slot in sorted(slots, key=lambda s: s.index)]
    return hashlib.sha256(json.dumps(documents, sort_keys=True).encode()).hexdigest()[:16]
