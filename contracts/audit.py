"""The typed messages of the reconciler: what a node agent says it holds, what PostgreSQL and Temporal say, and the
findings and repairs that come out of comparing them.

Shared by the node agent (`host_state`, `wipe_slots`), the control activities (`activities/control/audit.py`), the
pure comparison (`activities/control/drift.py`), the `Reconcile` workflow and the API, so every side of every call
agrees on one shape.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from contracts.task_queues import CONTROL_QUEUE


class Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class FindingKind(StrEnum):
    ORPHAN_VM = "orphan_vm"
    STALE_CLAIM = "stale_claim"
    MISSING_VM = "missing_vm"
    RESERVED_WITHOUT_CLAIM = "reserved_without_claim"
    ORPHAN_LEASE = "orphan_lease"
    QUARANTINE_WIPED = "quarantine_wiped"
    AGENT_UNREACHABLE = "agent_unreachable"
    ABANDONED_ALLOCATION = "abandoned_allocation"  # unfinished in PostgreSQL, its workflow ended (say, terminated)
    NOMINATION_TAKEN = "nomination_taken"  # a node held for a preemptor was given to another allocation
    RESERVATION_OVERBOOKED = "reservation_overbooked"  # a node cannot give its reservations their GPUs
    ABANDONED_RESERVATION = "abandoned_reservation"  # open in PostgreSQL, its workflow ended (say, terminated)
    GPU_FAILURE_UNTOLD = "gpu_failure_untold"  # an active allocation holds a failed GPU and was not told
    GPU_REPAIRED = "gpu_repaired"  # an operator's repair of a slot's GPU (`berth nodes repair`), for the trail
    USAGE_DRIFT = "usage_drift"  # the usage ledger and an allocation's claims disagree (store/usage.py)


class RepairAction(StrEnum):
    """What `--repair` does about a finding; the workflow runs the node step, then the control step."""

    DESTROY_VM = "destroy_vm"  # node: destroy the VM and wipe its slots
    TEARDOWN = "teardown"  # node: destroy any VM and wipe; control: release the claims, free the slots
    FREE_SLOT = "free_slot"  # node: wipe the slot; control: reserved -> available
    LIFT_QUARANTINE = "lift_quarantine"  # node: wipe the slot; control: quarantined -> available
    RELEASE_LEASE = "release_lease"  # node: delete the lease file
    CLOSE_ALLOCATION = "close_allocation"  # control only: the row becomes final (failed, saying why)
    TELL_ALLOCATION = "tell_allocation"  # control only: signal the allocation that its GPU failed (`degraded`)
    MARK_REPAIRED = "mark_repaired"  # an operator's: the slot is healthy again until its agent judges otherwise
    REBUILD_USAGE = "rebuild_usage"  # control only: the allocation's ledger intervals rebuilt from its claims


# What a node agent holds -------------------------------------------------------------------------------------------


class VmFact(Model):
    allocation_id: str
    vm_id: str
    slot_indexes: list[int]
    created_at: datetime


class LeaseFact(Model):
    allocation_id: str
    slot_indexes: list[int]
    expires_at: datetime


class HostState(Model):
    """One agent's own account of its host (`host_state`), or the note that it did not answer."""

    node: str
    reachable: bool = True
    error: str | None = None
    vms: list[VmFact] = Field(default_factory=list)
    leases: list[LeaseFact] = Field(default_factory=list)
    read_at: datetime | None = None


class WipeRequest(Model):
    node: str
    slot_indexes: list[int]


class WipeResult(Model):
    wiped_slots: list[int]


# What PostgreSQL and Temporal hold ----------------------------------------------------------------------------------


class ClaimFact(Model):
    allocation_id: str
    node: str
    slot_id: int
    slot_index: int
    claimed_at: datetime | None = None


class NominationFact(Model):
    """A node an admission pass holds for a queued request whose preemption it decided."""

    allocation_id: str  # the preemptor
    node: str
    victims: list[str]
    nominated_at: datetime
    gpus: int = 0  # the preemptor's


class ReservationFact(Model):
    """A reservation whose GPUs are held for it: not started, or started and its allocation holds no claim yet."""

    reservation_id: str
    node: str
    gpus: int
    starts_at: datetime
    ends_at: datetime
    node_gpus: int  # its node's GPUs that can be given out (approved, not quarantined)


class OpenReservationFact(Model):
    """A reservation that is `reserved` or `started` in PostgreSQL, whose workflow should be running."""

    reservation_id: str
    node: str
    state: str


class FailedSlotFact(Model):
    """A slot whose GPU its agent judged failed."""

    node: str
    slot_index: int
    reason: str | None = None


class UsageDriftFact(Model):
    """An allocation's attempt whose interval in the usage ledger differs from what its claims say."""

    allocation_id: str
    attempt: int
    message: str


class SlotFact(Model):
    """A slot that is not available (reserved or quarantined): available ones cannot drift this way."""

    node: str
    slot_id: int
    slot_index: int
    state: str
    quarantine_reason: str | None = None


class AllocationFact(Model):
    allocation_id: str
    state: str
    node: str | None = None
    ends_at: datetime | None = None  # its lease's end; None: no end
    preemptible: bool = False  # of a preemptible PriorityClass: a reservation's start preempts it


class ControlFacts(Model):
    claims: list[ClaimFact] = Field(default_factory=list)  # active ones
    slots: list[SlotFact] = Field(default_factory=list)  # reserved and quarantined ones
    allocations: list[AllocationFact] = Field(default_factory=list)  # unfinished ones (not released/failed/cancelled)
    in_flight: list[str] = Field(default_factory=list)  # allocation ids whose allocation or recovery workflow is open
    nominations: list[NominationFact] = Field(default_factory=list)  # nodes held for preemptors
    reservations: list[ReservationFact] = Field(default_factory=list)  # GPUs held for reservations' windows
    open_reservations: list[OpenReservationFact] = Field(default_factory=list)
    reservations_in_flight: list[str] = Field(default_factory=list)  # reservation ids whose workflow is open
    failed_slots: list[FailedSlotFact] = Field(default_factory=list)  # slots whose GPU failed
    usage_drift: list[UsageDriftFact] = Field(default_factory=list)  # the ledger against the last day's claims


# What comes out -------------------------------------------------------------------------------------------------------


class Finding(Model):
    kind: FindingKind
    node: str | None = None
    allocation_id: str | None = None
    slot_indexes: list[int] = Field(default_factory=list)
    message: str
    first_seen: datetime
    repair: RepairAction | None = None  # what --repair would do
    blocked: str | None = None  # why it is not done now (in flight, grace period, agent unreachable)

    def key(self) -> tuple[str, str, str, tuple[int, ...]]:
        """Identity across audits: the same drift seen again keeps its first_seen."""
        return (self.kind.value, self.node or "", self.allocation_id or "", tuple(self.slot_indexes))

    @property
    def repairable(self) -> bool:
        return self.repair is not None and self.blocked is None


class Repair(Model):
    kind: FindingKind
    action: RepairAction
    node: str | None = None
    allocation_id: str | None = None
    slot_indexes: list[int] = Field(default_factory=list)
    outcome: str  # done | skipped | failed
    message: str
    at: datetime | None = None


class AuditReport(Model):
    run_id: int | None = None
    workflow_id: str | None = None
    trigger: str = "schedule"
    repair: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    nodes_checked: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    repairs: list[Repair] = Field(default_factory=list)


# Activity and workflow arguments ------------------------------------------------------------------------------------


class AuditTargets(Model):
    nodes: list[str]


class AssessInput(Model):
    workflow_id: str
    trigger: str
    repair: bool
    control_queue: str = CONTROL_QUEUE  # open workflows are looked up on this queue only
    orphan_grace_seconds: float
    hosts: list[HostState]


class IdleCheck(Model):
    allocation_id: str
    control_queue: str = CONTROL_QUEUE  # open workflows are looked up on this queue only


class ApplyRepair(Model):
    """The control half of a repair, and its record; `node_error` says the node half failed (record only)."""

    run_id: int
    finding: Finding
    control_queue: str = CONTROL_QUEUE  # open workflows are looked up on this queue only
    node_error: str | None = None


class FinishAudit(Model):
    run_id: int
