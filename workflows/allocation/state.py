"""What one run of an allocation knows, in one place: `RunState`. The workflow (workflow.py) makes it and hands the
same instance to each of its parts (placement, attempt, hold, messages, calls, mirror, clock), so there is one
answer to "where is this kept" and no part keeps a copy of another's state.

A run begins from a request or from a hold. When a hold goes on in a fresh run (continue-as-new), what the hold
needs travels as `AllocationInput.held` (`RunState.held`), and the next run's `RunState.begin` takes it back: the
allocation's status, its pool's deadlines and its lease. The rest (the placement's candidates, the queue, the
messages not yet acted on) belongs to the run that placed it: a hold hands over only with none of it pending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.allocation import HealthNotice, PreemptNotice
    from workflows.allocation.messages import AllocationInput, AllocationStatus, Deadlines, HandOverRequest, Held


@dataclass
class Inbox:
    """What the messages asked that the flow has yet to act on (handlers.py writes it, the flow reads it)."""

    retry: bool = False  # abandon the running attempt, go on with the next candidate
    release: bool = False  # give everything back: final state `released`
    woken: bool = False  # an admission pass set a node aside for this queued request: place again
    end_moved: bool = False  # an extension came: the hold re-reads the end
    notice: PreemptNotice | None = None  # told to leave for a queued request
    # What its owner must be told while it holds: (state to take, None to keep; step; reason).
    untold: list[tuple[str | None, str, str]] = field(default_factory=list)
    replacement: HealthNotice | None = None  # its pool replaces it off a failed GPU (`onGpuFailure`)
    hand_over: HandOverRequest | None = None  # an operator asked the hold to go on in a fresh run


@dataclass
class RunState:
    input: AllocationInput
    status: AllocationStatus  # what the `status_query` answers and the mirror shows
    deadlines: Deadlines  # each state's: the defaults, then the chosen pool's once one of its nodes is tried
    active_since: datetime | None = None  # when it became active: its lease counts from then
    max_lease: float | None = None  # its pool's `maxLease` in seconds: extensions stop there
    inbox: Inbox = field(default_factory=Inbox)
    # Placing, steps 1 to 3.
    excluded: set[str] = field(default_factory=set)  # the request's exclusions and every operator's `retry`'s
    tried: set[str] = field(default_factory=set)  # never the same node twice in one round
    pool_deadlines: dict[str, dict[str, float]] = field(default_factory=dict)  # of the candidates' pools seen
    pool_max_leases: dict[str, float] = field(default_factory=dict)  # of the candidates' pools seen, in seconds
    final_recorded: bool = False  # the placement step refused and recorded the final step itself
    # Queued: waiting in its region's queue.
    queue_deadline: datetime | None = None
    in_queue: bool = False  # its entry is in the queue (the placement step takes it out when it places)
    fruitless: int = 0  # times it was woken (or placed) and could not be placed after all

    @classmethod
    def begin(cls, input: AllocationInput) -> RunState:
        """A run's state at its start: a request's (`pending`), or the hold's it takes over."""
        queue_deadline = (
            workflow.now() + timedelta(seconds=input.queue.timeout_seconds) if input.queue is not None else None
        )
        excluded = set(input.request.exclude_nodes)
        held, run_id = input.held, workflow.info().run_id
        if held is None:
            status = AllocationStatus(
                allocation_id=input.allocation_id, run_id=run_id, tenant=input.tenant, state="pending", step="accepted"
            )
            return cls(input, status, input.timing.deadlines, excluded=excluded, queue_deadline=queue_deadline)
        return cls(
            input,
            held.status.model_copy(update={"run_id": run_id}),
            held.deadlines,
            held.active_since,
            held.max_lease_seconds,
            excluded=excluded,
            queue_deadline=queue_deadline,
        )

    def held(self, handed_over_because: str) -> Held:
        """What the next run takes over when this hold hands over (continue-as-new); it names this run as the one it
        continues, and why."""
        return Held(
            status=self.status,
            deadlines=self.deadlines,
            active_since=self.active_since,
            max_lease_seconds=self.max_lease,
            previous_run_id=workflow.info().run_id,
            handed_over_because=handed_over_because,
        )
