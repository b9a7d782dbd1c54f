"""The typed messages that cross the Temporal boundary between the allocation workflow and its activities.

One pydantic model per activity argument and result (docs/design.md, "Temporal practice"), shared by the control worker and the node
agents, so both sides of every call agree on its shape.
"""

from __future__ import annotations

from datetime import datetime

import yaml
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PositiveFloat, model_validator

from contracts.explanation import Explanation
from contracts.placement import Bundle, Candidate, CapacityShape, NumaPolicy, PlacementRequest

# Every state an allocation is in, as its workflow, its row (a CHECK constraint) and the API name them.
ALLOCATION_STATES = (
    "pending",
    "queued",
    "placing",
    "planning",
    "claiming",
    "provisioning",
    "waiting_ready",
    "active",
    "releasing",
    "released",
    "failed",
    "cancelled",
    "expired",
    "preempting",
    "preempted",
    "degraded",
)
PLACING_STATES = ("pending", "placing", "planning", "claiming", "provisioning", "waiting_ready")
FINAL_STATES = ("released", "failed", "cancelled", "expired", "preempted")
# placed and running: release and cancel tear it down (`degraded`: a GPU of it failed, its owner told)
HOLDING_STATES = ("active", "preempting", "degraded")
# running for its owner (not being preempted): it can be extended, and is told of a failed GPU or a drain
RUNNING_STATES = ("active", "degraded")

# Every state a reservation is in (its row's CHECK constraint, the API's view): `reserved` until its start, `started`
# once its allocation was asked for, then one of the final ones.
RESERVATION_STATES = ("reserved", "started", "ended", "cancelled", "failed")
RESERVATION_FINAL_STATES = ("ended", "cancelled", "failed")

# A tenant's cloud-config (`VmSpec.user_data`): at most this many bytes (UTF-8), the API's limit. The VM's NoCloud
# seed already carries one document, which the tenant's is merged into.
USER_DATA_MAX_BYTES = 64 * 1024
# The keys the seed sets itself, and why a tenant's document may not set them: each is part of how the tenant's
# VM is reached and locked down, so the API refuses a document that sets one rather than let it be replaced.
USER_DATA_RESERVED_KEYS: dict[str, str] = {
    "hostname": "Berth names the VM after its allocation",
    "fqdn": "Berth names the VM after its allocation",
    "ssh_authorized_keys": "the allocation's ssh_public_keys are the keys that log in",
    "ssh_pwauth": "Berth's VMs take key logins only",
    "disable_root": "Berth's VMs allow no root login",
    "users": "a users list replaces the default user, which carries the allocation's ssh_public_keys, "
    "and would lock the tenant out",
}


def cloud_config_problem(text: str) -> tuple[str, str] | None:
    """What is wrong with a cloud-config document's content, as (problem type, message), or None. It must parse as
    a YAML mapping (the header alone is an empty one), so that the agent can merge it into the seed's own document,
    and may not set a key that document sets (`USER_DATA_RESERVED_KEYS`, each with why). No JSON Schema can state
    either, so each is a problem type of its own under `invalid_request` (tests/api/schemathesis_hooks.py)."""
    try:
        document = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as error:  # RecursionError: nested deeper than the parser recurses
        problem = " ".join(str(error).split()) if isinstance(error, yaml.YAMLError) else "it is nested too deeply"
        return "user_data_yaml", f"is not YAML: {problem}"
    if document is None:
        return None
    if not isinstance(document, dict):
        kind = "list" if isinstance(document, list) else "scalar"
        return "user_data_not_mapping", f"is a YAML {kind}, not a mapping: a cloud-config document maps module keys"
    reserved = [key for key in USER_DATA_RESERVED_KEYS if key in document]
    if reserved:
        why = "; ".join(f"{key}: {USER_DATA_RESERVED_KEYS[key]}" for key in reserved)
        return "user_data_reserved_key", f"may not set {', '.join(reserved)}, which Berth's seed sets itself ({why})"
    return None


def cloud_config(text: str) -> dict[str, object]:
    """The tenant's cloud-config as the mapping the agent merges into the seed's own document; ValueError, with
    `cloud_config_problem`'s message, for one the API would have refused."""
    problem = cloud_config_problem(text)
    if problem is not None:
        raise ValueError(f"user-data {problem[1]}")
    return yaml.safe_load(text) or {}


class Model(BaseModel):
    model_config = ConfigDict(frozen=True)


# The audit trail ---------------------------------------------------------------------------------------------


class AllocationRecord(Model):
    """Creates the allocation's row the first time it is seen; later calls change nothing."""

    allocation_id: str
    tenant: str
    request: PlacementRequest
    workflow_id: str
    request_body: dict[str, object] = Field(default_factory=dict)
    idempotency_key: str | None = None
    requested_by: str | None = None  # who asked for it (a reservation's allocation: who reserved it)


class StateChange(Model):
    """One step of the story: mirrored into the allocations row and appended to allocation_events."""

    allocation_id: str
    run_id: str
    state: str
    step: str
    attempt: int | None = None
    node: str | None = None
    region: str | None = None
    pool: str | None = None
    reason: str | None = None
    detail: dict[str, object] = Field(default_factory=dict)
    at: datetime | None = None  # when the workflow changed state; None: when it is written
    ends_at: datetime | None = None  # the allocation's end as of this step (active, extended), mirrored to its row
    actor: str | None = None  # who decided the step when not the workflow itself asked by someone (`berth:expiry`)


class AuditTrail(Model):
    """The steps the workflow has taken since its last write to PostgreSQL, oldest first.

    The workflow does not stop to write each step: the trail rides with the next control activity, which writes it
    in its own transaction before doing its work, and is written on its own (a local activity) only before a wait
    with no control step ahead of it. Writing a trail twice changes nothing."""

    opening: AllocationRecord | None = None
    changes: list[StateChange] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return self.opening is not None or bool(self.changes)


# Control side --------------------------------------------------------------------------------------------------


class Refusal(Model):
    """A placement level that said no (docs/seeds.md, "Four layers, each deciding only what it knows"): the code,
    the message, and the explanation of every level it ran."""

    refusal_code: str | None = None
    refusal_message: str | None = None
    explanation: Explanation | None = None

    @property
    def reason(self) -> str:
        """The refusal as the allocation's failure reason: what the row, the audit trail and the workflow's failure
        all say."""
        return f"{self.refusal_code}: {self.refusal_message}"


class RegionChoice(Refusal):
    region: str | None


class CandidateList(Refusal):
    candidates: list[Candidate] = Field(default_factory=list)
    # pool (cluster/pool) -> the per-state deadlines in seconds it sets (fleet `deadlines`); absent: the defaults
    deadlines: dict[str, dict[str, float]] = Field(default_factory=dict)
    # pool (cluster/pool) -> the longest lease it grants in seconds (fleet `maxLease`); absent: no maximum
    max_leases: dict[str, float] = Field(default_factory=dict)


class QueueTicket(Model):
    """A request that may wait for capacity: how it is ordered, and whether it is in its region's queue already."""

    priority: int = 0
    priority_class: str | None = None
    queued: bool = False


class FindCandidatesInput(Model):
    allocation_id: str
    request: PlacementRequest
    region: str
    trail: AuditTrail = Field(default_factory=AuditTrail)
    # The allocation's final step if this one refuses (`choose_placement` only): the step records it with the
    # refusal's reason, so a refused allocation needs no second write. None: the workflow records it itself.
    final: StateChange | None = None
    # Waiting for capacity (`choose_placement` only): whether the request may wait, at what priority, and
    # whether it is in its region's queue already (then a placement chosen takes it out of the queue).
    wait: QueueTicket | None = None


class ClaimInput(Model):
    allocation_id: str
    attempt: int
    node: str
    tenant: str
    gpu_count: int
    bundles: list[Bundle]
    within_nominal: bool = False  # of a non-preemptible class: its quota is re-checked without borrowing
    trail: AuditTrail = Field(default_factory=AuditTrail)


class ReleaseClaimsInput(Model):
    allocation_id: str
    attempt: int | None = None  # None: every active claim of the allocation
    # The region whose queue to walk once the claims are released: capacity freed is offered to the
    # requests waiting for it in the same step, at no extra cost to the workflow. None: no queue is walked.
    walk_region: str | None = None
    trail: AuditTrail = Field(default_factory=AuditTrail)


class QuarantineInput(Model):
    allocation_id: str
    attempt: int
    node: str
    slot_indexes: list[int]
    reason: str
    trail: AuditTrail = Field(default_factory=AuditTrail)


class SlotsInput(Model):
    node: str
    slot_indexes: list[int]


# Node side -----------------------------------------------------------------------------------------------------


class PlanInput(Model):
    allocation_id: str
    attempt: int
    gpu_count: int
    shape: CapacityShape
    numa_policy: NumaPolicy = NumaPolicy.PREFERRED
    gpus: list[str] = Field(
        default_factory=list,
        description="Pinned GPUs (PCI addresses): plan exactly these slots or refuse. Empty in "
        "histories recorded before GPUs could be pinned.",
    )


class PlanOutcome(Model):
    """A leased plan, or the node scheduler's topology-specific refusal."""

    node: str
    bundles: list[Bundle] = Field(default_factory=list)
    lease_expires_at: datetime | None = None
    refusal_code: str | None = None
    refusal_message: str | None = None
    # The host's VMs can pass their readiness gates the moment they exist (`VmDriver.ready_when_created`): the
    # workflow then asks the create for the first readiness look (`VmSpec.first_look`). False from agents older than
    # it, and wherever a guest boots.
    ready_when_created: bool = False

    @property
    def slot_indexes(self) -> list[int]:
        return [b.slot_index for b in self.bundles]


class LeaseRef(Model):
    allocation_id: str
    node: str


class ReadinessInput(Model):
    allocation_id: str
    node: str
    gpu_count: int
    poll_seconds: float = 0.25
    window_seconds: float = 5.0


class Readiness(Model):
    """The three readiness gates by name (`ssh`, `cloud_init`, `gpus`; docs/seeds.md, "Readiness gates"); `ready`
    when all pass.
    `failed_gate` names a gate that failed for good (cloud-init reported an error, the guest sees the wrong number of
    GPUs): the attempt fails at once with `readiness_failed: <gate>: <failure>` instead of waiting out its timeout."""

    ssh: bool
    cloud_init: bool
    nvidia_smi: bool
    detail: str = ""
    failed_gate: str | None = None
    failure: str | None = None
    address: str | None = None  # where the gates reached the VM (the plan's address, or its DHCP lease)
    console: list[str] = Field(default_factory=list)  # the serial console's last lines while it is not ready

    @property
    def ready(self) -> bool:
        return self.ssh and self.cloud_init and self.nvidia_smi

    def pending(self) -> list[str]:
        gates = {"ssh": self.ssh, "cloud_init": self.cloud_init, "gpus": self.nvidia_smi}
        return [name for name, passed in gates.items() if not passed]


class VmSpec(Model):
    allocation_id: str
    node: str
    bundles: list[Bundle]
    image: str | None = None
    ssh_public_keys: list[str] = Field(default_factory=list)
    # The tenant's `#cloud-config` document, as text, as the API accepted it: its first line `#cloud-config`, a YAML
    # mapping setting none of USER_DATA_RESERVED_KEYS, at most USER_DATA_MAX_BYTES. The agent merges it into the
    # seed's own user-data. None: the seed's document alone.
    user_data: str | None = None
    # The readiness look the create takes once the VM exists, asked where the plan's answer said the host's VMs are
    # ready the moment they exist (`PlanOutcome.ready_when_created`); its report comes back in `VmInfo.readiness`, and
    # a VM ready then needs no `wait_ready` step. A host whose guests boot takes no look, as agents older than it.
    first_look: ReadinessInput | None = None


class VmInfo(Model):
    allocation_id: str
    node: str
    vm_id: str
    private_ips: list[str] = Field(default_factory=list)
    readiness: Readiness | None = None  # the first look's report, where the create took one (`VmSpec.first_look`)


class TeardownInput(Model):
    allocation_id: str
    node: str
    slot_indexes: list[int] = Field(default_factory=list)


class TeardownResult(Model):
    vm_destroyed: bool
    wiped_slots: list[int]


class PlacementChoice(Model):
    """Both decisions of one `choose_placement` step. `candidates` is None when the region level refused: the
    cluster level never ran, and the workflow records only the region's step."""

    region: RegionChoice
    candidates: CandidateList | None = None
    # The step refused and recorded the allocation's final step itself (the input's `final`): the workflow ends
    # failed without writing it again. Replay reads it from the step's recorded result.
    final_recorded: bool = False
    # Refused, but freed capacity could cure it (a request that may wait waits in `queue_region`'s queue): the
    # cluster level's insufficient_capacity, the tenant's quota when the request alone fits in it, or a StrictFIFO
    # queue that has requests ahead of it (`queued_behind`).
    waitable: bool = False
    queue_region: str | None = None

    def refusal(self) -> RegionChoice | CandidateList | None:
        """The level that refused, if one did."""
        if self.region.region is None:
            return self.region
        if self.candidates is not None and self.candidates.refusal_code is not None:
            return self.candidates
        return None


class EnterQueueInput(Model):
    """Wait in `region`'s queue until `deadline_at`; `reason`/`code`: why it is not placed now."""

    allocation_id: str
    tenant: str
    region: str
    request: PlacementRequest
    ticket: QueueTicket
    deadline_at: datetime
    reason: str
    code: str
    trail: AuditTrail = Field(default_factory=AuditTrail)


class LeaveQueueInput(Model):
    allocation_id: str
    region: str | None = None  # the region whose queue to walk again after it left (None: none)
    trail: AuditTrail = Field(default_factory=AuditTrail)


class PreemptNotice(Model):
    """Sent to an active allocation an admission pass chose to preempt: who displaces it, by priority
    only (never by tenant), the rule that allows it, and how long it keeps running."""

    priority: int
    priority_class: str | None = None
    grace_seconds: float = 30.0
    rule: str = ""


class HealthNotice(Model):
    """Sent to an allocation holding a slot whose GPU its agent judged failed: which slot, and why."""

    slot: str  # "<node>/<index>"
    reason: str
    replace: bool = False  # its pool's `onGpuFailure: Replace`: move to a healthy node after telling the owner


class DrainNotice(Model):
    """Sent to each allocation of a node an operator drains."""

    node: str
    reason: str = "an operator's drain"


class ReservationStart(Model):
    """A reservation's start: its allocation's id, and the preemptible allocations on its node to tell
    to leave so it has room, each with its grace period."""

    allocation_id: str
    victims: list[tuple[str, float]] = Field(default_factory=list)


class ReservationRef(Model):
    reservation_id: str
    state: str = ""  # for `finish_reservation`: ended, cancelled or failed
    reason: str | None = None


class AdmitInput(Model):
    """Walk these regions' queues now (None: every region with a queue)."""

    regions: list[str] | None = None
    trail: AuditTrail = Field(default_factory=AuditTrail)


class AdmitResult(Model):
    woken: list[str] = Field(default_factory=list)  # allocations woken to place themselves
    waiting: int = 0


class Lease(BaseModel):
    """When an allocation ends by itself: `duration_seconds` after it becomes active, or at `ends_at`."""

    model_config = ConfigDict(frozen=True)

    duration_seconds: PositiveFloat | None = None
    ends_at: AwareDatetime | None = None

    @model_validator(mode="after")
    def _one(self) -> Lease:
        if (self.duration_seconds is None) == (self.ends_at is None):
            raise ValueError("a lease gives exactly one of duration_seconds and ends_at")
        return self
