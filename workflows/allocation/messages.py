"""What goes into an allocation workflow and what it answers: its input, its status, and the operators' messages."""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PositiveFloat, model_validator

from contracts.placement import Bundle, PlacementRequest
from contracts.task_queues import Queues


class Deadlines(BaseModel):
    """The longest an allocation may stay in each state before it compensates and fails (`deadline_exceeded`).

    A state's clock starts when the allocation enters it (`placing`: again with each new list of candidates, since
    compensating a failed attempt is bounded on its own). `placing` covers `pending`. `waiting_ready` bounds the
    whole wait where `Timing.readiness_timeout_seconds` bounds one node's (which moves on to the next candidate).
    `releasing` bounds the host's part of a release: past it the slots are quarantined (wiped when the agent is
    back) and the release completes, so a release never fails on it. A pool may set its own (fleet `deadlines`);
    they apply once a candidate of that pool is tried, the defaults before."""

    model_config = ConfigDict(frozen=True)

    placing: PositiveFloat = 600.0
    planning: PositiveFloat = 300.0
    claiming: PositiveFloat = 300.0
    provisioning: PositiveFloat = 1200.0
    waiting_ready: PositiveFloat = 1200.0
    releasing: PositiveFloat = 1800.0

    def of(self, state: str) -> float | None:
        """The state's deadline in seconds; None for a state with none (active, final states)."""
        return self.placing if state == "pending" else getattr(self, state, None)

    def with_overrides(self, seconds: dict[str, float]) -> Deadlines:
        return self.model_copy(update={k: v for k, v in seconds.items() if k in type(self).model_fields})


class Timing(BaseModel):
    """How long the workflow waits for each thing. Defaults suit real hosts; tests shorten them."""

    model_config = ConfigDict(frozen=True)

    agent_pickup_seconds: PositiveFloat = Field(
        default=5.0, description="A node agent that has not picked a task up by then is treated as unreachable."
    )
    readiness_timeout_seconds: PositiveFloat = 600.0
    readiness_poll_seconds: PositiveFloat = 5.0
    readiness_window_seconds: PositiveFloat = Field(
        default=5.0, description="How long one wait_ready activity probes before reporting back."
    )
    teardown_attempts: int = Field(
        default=3, ge=1, description="Tries to reach a node for teardown before its slots are quarantined."
    )
    deadlines: Deadlines = Field(default_factory=Deadlines, description="Per state; a pool may override them.")
    expiry_warning_seconds: PositiveFloat = Field(
        default=900.0, description="How long before an allocation's end its owner is warned (`expiring`)."
    )
    hold_history_events: int = Field(
        default=1000,
        ge=50,
        description="A held run whose history reaches this many events hands over to a fresh run (continue-as-new), "
        "as it does when Temporal suggests it: the page an operator opens stays readable.",
    )


# The allocation workflow's revision that runs started now get (`AllocationInput.revision`), and what each one
# changed. A run keeps the revision it was started with, so a history replays the way it was made; unlike a
# `workflow.patched` marker, a revision costs no history event and no search-attribute upsert.
#   1: the control steps are local activities; `placing` is published with the placement decision (a refused
#      request goes from `pending` straight to `failed`), and a refusal is recorded by the placement step itself.
#   2: the run that reaches `active` continues as new into its hold run (`AllocationInput.held`), which waits for
#      release or cancellation and tears down: the long-lived history holds only the hold.
#   3: a request that may wait (`AllocationInput.queue`) waits in its region's queue (`queued`) instead of failing.
#      (Releasing claims walks the region's queue in every revision: the pass rides on the step, adding no command.)
#   4: the run that reaches `active` holds it itself: the Temporal UI's page of the allocation tells its whole story,
#      and nothing waits for the server's minimum interval between runs (`history.continueAsNewMinInterval`, 1 s).
#      It hands over to a hold run only when its history grows long (Temporal's suggestion, or
#      `Timing.hold_history_events`) or an operator asks (the `hand_over` signal, before an upgrade that drops its
#      revision), and the run it leaves keeps no Berth search attribute, so every filter lists the allocation once.
#   5: a release (an owner's, a preemption's, an expiry's) writes `releasing` to the allocation's row before the
#      host's teardown starts, so the API never shows `active` for an allocation whose VM is being destroyed (a
#      teardown waiting for an unreachable agent can take the pool's whole `releasing` deadline); its final state
#      rides with the release of the claims, in that step's transaction, instead of a write of its own.
#   6: the run starts in `placing` (its search attribute set by the start itself, as the run's first step is the
#      placement), so the decision costs no upsert of its own: the region it chose is published with `provisioning`
#      (or `queued`, or the refusal's `failed`). 9 actions to `active` and 15 through release, from 10 and 16. An
#      allocation with an end (a lease, its pool's maxLease) publishes the end with `active`, in the same upsert.
#   7: the lease's release is registered before the node's plan, not after its answer: a plan whose answer is
#      lost (its deadline passed while the agent was still planning, a worker gone after leasing) may have leased,
#      and the attempt's undo now gives that lease back at once instead of leaving it to its expiry. A refusal
#      leases nothing, so it drops that undo.
# The workflow keeps the branches of the previous revision only (docs/design.md, "Upgrading the allocation
# workflow"): a placement phase in flight drains within its per-state deadlines; revision 2 differs from 3 only in
# never being queued, which needs no branch, and its hold runs are revision 3's.
REVISION = 7
HOLD_IN_PLACEMENT_RUN = 4  # the first revision whose placement run holds the allocation itself
RELEASING_WRITTEN_FIRST = 5  # the first revision whose teardown writes `releasing` before the host's part
PLACING_FROM_START = 6  # the first revision started in `placing` rather than `pending`
END_WITH_ACTIVE = 6  # the first revision whose end is published with `active`, in one upsert
LEASE_UNDONE_BEFORE_PLAN = 7  # the first revision that registers the lease's release before the plan


class AllocationInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    allocation_id: str
    tenant: str
    request: PlacementRequest
    image: str | None = None
    ssh_public_keys: list[str] = Field(default_factory=list)
    user_data: str | None = Field(
        default=None, description="The tenant's `#cloud-config` document, checked by the API (`VmSpec.user_data`)."
    )
    labels: dict[str, str] = Field(default_factory=dict)
    request_body: dict[str, object] = Field(default_factory=dict, description="The API body, kept for the audit.")
    idempotency_key: str | None = Field(default=None, description="The create request's Idempotency-Key, if any.")
    actor: str | None = Field(
        default=None, description="Who asked for it (a person or a service account): `BerthActor` in the UI."
    )
    timing: Timing = Field(default_factory=Timing)
    queues: Queues = Field(default_factory=Queues)
    revision: int = Field(
        default=0, ge=0, description="The workflow revision the run was started with (`REVISION`); 0: before them."
    )
    held: Held | None = Field(default=None, description="A hold run's start: the active allocation it holds.")
    queue: QueueWait | None = Field(default=None, description="Wait for capacity instead of failing.")
    lease: Lease | None = Field(default=None, description="An end for the allocation; None: no end.")


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


class QueueWait(BaseModel):
    """A request that may wait in its region's queue when no node can take it now (revision 3)."""

    model_config = ConfigDict(frozen=True)

    timeout_seconds: PositiveFloat = Field(description="How long it may wait, in all; past it: failed, queue_timeout.")
    priority: int = Field(default=0, description="Its PriorityClass's value: higher is placed first.")
    priority_class: str | None = None


class Attempt(BaseModel):
    number: int
    node: str
    pool: str
    outcome: str = "running"  # running, succeeded, failed, abandoned, cancelled
    reason: str | None = None


class AllocationStatus(BaseModel):
    allocation_id: str
    run_id: str | None = None  # which run of the workflow id this is (a failed allocation may be retried)
    tenant: str
    state: str
    step: str
    region: str | None = None
    pool: str | None = None
    node: str | None = None
    bundles: list[Bundle] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    failure_reason: str | None = None
    waiting_reason: str | None = None  # queued: why it is not placed yet (the refusal it waits on)
    ends_at: datetime | None = None  # active with an end: when its release saga runs
    expiry_warned: bool = False  # its owner has been told it ends soon (`expiring`)
    drain_told: bool = False  # its owner has been told its node is being drained


class Held(BaseModel):
    """What a hold run takes over from the run before it (continue-as-new): the run that placed the allocation
    (revisions 2 and 3, at `active`), or a hold whose history grew long (revision 4)."""

    model_config = ConfigDict(frozen=True)

    status: AllocationStatus
    deadlines: Deadlines = Field(description="The chosen pool's: `releasing` bounds the teardown.")
    active_since: datetime | None = Field(default=None, description="When it became active (a lease counts from it).")
    max_lease_seconds: float | None = Field(default=None, description="The pool's `maxLease`: extensions stop there.")
    previous_run_id: str | None = Field(default=None, description="The run it continues (revision 4): its story.")
    handed_over_because: str | None = Field(default=None, description="Why that run handed over (revision 4).")


AllocationInput.model_rebuild()


class RetryRequest(BaseModel):
    exclude_nodes: list[str] = Field(default_factory=list)


class RetryAccepted(BaseModel):
    abandoned_node: str | None
    excluded_nodes: list[str]


class ReleaseRequest(BaseModel):
    reason: str | None = None


class ExtendRequest(BaseModel):
    """Move an active allocation's end later: by `seconds` from its current end, or to `ends_at`."""

    seconds: PositiveFloat | None = None
    ends_at: AwareDatetime | None = None
    # The latest end the reservations of its node allow, as the API read them under the region's placement lock
    # (scheduler.admission.reservations.latest_end), and why; None: no reservation limits it.
    not_after: AwareDatetime | None = None
    not_after_reason: str | None = None

    @model_validator(mode="after")
    def _one(self) -> ExtendRequest:
        if (self.seconds is None) == (self.ends_at is None):
            raise ValueError("an extension gives exactly one of seconds and ends_at")
        return self


class HandOverRequest(BaseModel):
    """Ask a held allocation's run to go on in a fresh run (the `hand_over` signal)."""

    reason: str | None = None
