"""What goes into an allocation workflow and what it answers: its input, its status, and the operators' messages."""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PositiveFloat, model_validator

from contracts.allocation import AllocationRecord, Lease
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
        default=0,
        ge=0,
        description="The workflow revision the run was started with (revisions.py, `REVISION`); 0: before them.",
    )
    held: Held | None = Field(default=None, description="A hold run's start: the active allocation it holds.")
    queue: QueueWait | None = Field(default=None, description="Wait for capacity instead of failing.")
    lease: Lease | None = Field(default=None, description="An end for the allocation; None: no end.")

    def opening(self, workflow_id: str) -> AllocationRecord:
        """The allocation's row as its trail opens it: the workflow's first step writes it, and the API writes the
        same record a moment earlier (`store.trail.write_trail`, which makes a second write change nothing), so a
        read right after the create finds it."""
        return AllocationRecord(
            allocation_id=self.allocation_id,
            tenant=self.tenant,
            request=self.request,
            workflow_id=workflow_id,
            request_body=self.request_body,
            idempotency_key=self.idempotency_key,
            requested_by=self.actor,
        )


class QueueWait(BaseModel):
    """A request that may wait in its region's queue when no node can take it now."""

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
    """What a hold run takes over from the run before it (continue-as-new): a hold whose history grew long or that an
    operator asked to hand over (or, in retired revisions 2 and 3, the run that placed the allocation, at `active`).
    The run state's part that outlives a run (state.py, `RunState.held`)."""

    model_config = ConfigDict(frozen=True)

    status: AllocationStatus
    deadlines: Deadlines = Field(description="The chosen pool's: `releasing` bounds the teardown.")
    active_since: datetime | None = Field(default=None, description="When it became active (a lease counts from it).")
    max_lease_seconds: float | None = Field(default=None, description="The pool's `maxLease`: extensions stop there.")
    previous_run_id: str | None = Field(default=None, description="The run it continues: its story.")
    handed_over_because: str | None = Field(default=None, description="Why that run handed over.")


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
