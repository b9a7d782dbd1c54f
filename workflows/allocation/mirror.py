"""What the world sees of an allocation run: its status (the workflow's query), the Temporal UI (search attributes
and the current-details story) and PostgreSQL (the audit trail).

The trail is not written step by step: it travels with the next control step, which writes it before its own work,
and is written on its own only before a wait that no control step follows. Search attributes move only for the
states the UI filters on (`UI_STATES`): each upsert is a visibility write, a Temporal action a production namespace
pays for (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import SearchAttributePair, SearchAttributeUpdate, TypedSearchAttributes
from temporalio.exceptions import ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import FINAL_STATES, AuditTrail, StateChange
    from workflows import control_calls
    from workflows import search_attributes as sa
    from workflows.allocation.failures import as_activity_error
    from workflows.allocation.messages import AllocationInput, AllocationStatus, Attempt
    from workflows.allocation.state import RunState

R = TypeVar("R")

# The steps the control plane decides on its own, and who in it decided: the trail names them as it names the person
# whose request a step carries out (that request is its own event, written by the API: api/allocation_view.py).
PREEMPTION, EXPIRY = "berth:preemption", "berth:expiry"
CONTROL_PLANE_STEPS = {"preempt_notice": PREEMPTION, "preempt": PREEMPTION, "expiring": EXPIRY, "expire": EXPIRY}

# The state the UI shows from a run's start: placing is its first step, so the placement decision needs no upsert of
# its own.
STARTED_AS = "placing"

# The states worth a search-attribute upsert: long enough for the UI to filter on. `waiting_ready` only once a boot
# turns out not to be immediate (the workflow publishes it then); planning and claiming last milliseconds.
UI_STATES = frozenset(
    {
        "queued",
        "placing",
        "provisioning",
        "waiting_ready",
        "active",
        "preempting",
        "degraded",
        "releasing",
        *FINAL_STATES,
    }
)


class Mirror:
    def __init__(self, state: RunState) -> None:
        self.state = state
        self.trail = AuditTrail()  # steps not yet written to PostgreSQL
        # The search attribute values as they stand (set when the run was started), so only changes are upserted.
        input = state.input
        started_as = state.status.state if input.held is not None else STARTED_AS
        self.published: dict[str, str] = self.search_values(started_as, input.request.region)

    def move(
        self,
        state: str,
        step: str,
        *,
        node: str | None = None,
        attempt: Attempt | None = None,
        region: str | None = None,
        reason: str | None = None,
        publish: bool = True,
        recorded: bool = False,
        ends_at: datetime | None = None,
        also: Sequence[SearchAttributeUpdate[Any]] = (),
    ) -> None:
        """Move to a state: the status, the UI (search attributes for the states it filters on, unless `publish` is
        off, with `also` in the same upsert; the current details always) and the audit trail (unless a control step
        `recorded` the step already)."""
        status = self.state.status
        status.state, status.step = state, step
        if state == "failed":
            status.failure_reason = reason
        if publish and state in UI_STATES and state != "waiting_ready":
            self.publish(self.search_values(state, region, node), also)
        workflow.set_current_details(self.story())
        if not recorded:
            change = self.state_change(state, step, node=node, attempt=attempt, region=region, reason=reason)
            change = change.model_copy(update={"ends_at": ends_at}) if ends_at is not None else change
            self.trail = AuditTrail(opening=self.trail.opening, changes=[*self.trail.changes, change])

    def state_change(
        self,
        state: str,
        step: str,
        *,
        node: str | None = None,
        attempt: Attempt | None = None,
        region: str | None = None,
        reason: str | None = None,
    ) -> StateChange:
        """The step as the audit trail records it."""
        return StateChange(
            allocation_id=self.state.input.allocation_id,
            run_id=workflow.info().run_id,
            state=state,
            step=step,
            attempt=attempt.number if attempt else None,
            node=node,
            region=region or self.state.status.region,
            pool=attempt.pool if attempt else None,
            reason=reason,
            at=workflow.now(),
            actor=CONTROL_PLANE_STEPS.get(step),
        )

    def search_values(self, state: str, region: str | None = None, node: str | None = None) -> dict[str, str]:
        return {
            sa.STATE.name: state,
            sa.REGION.name: region or self.state.status.region or "",
            sa.NODE.name: node or self.state.status.node or "",
        }

    def publish(self, values: dict[str, str], also: Sequence[SearchAttributeUpdate[Any]] = ()) -> None:
        """Upsert the search attributes that changed, once per change of state (a step that keeps the state, finding
        candidates after choosing the region, waits for the next), and `also` with them: one upsert, one action."""
        changed: list[SearchAttributeUpdate[Any]] = []
        if self.published.get(sa.STATE.name) != values[sa.STATE.name]:
            keys = {sa.STATE.name: sa.STATE, sa.REGION.name: sa.REGION, sa.NODE.name: sa.NODE}
            changed = [keys[name].value_set(v) for name, v in values.items() if self.published.get(name) != v]
            self.published.update(values)
        if changed or also:
            workflow.upsert_search_attributes([*changed, *also])

    @staticmethod
    def end_values(ends_at: datetime | None, expiring: bool) -> list[SearchAttributeUpdate[Any]]:
        """The allocation's end and whether its owner was warned, for the UI to sort and filter on; none without an
        end."""
        if ends_at is None:
            return []
        return [sa.ENDS_AT.value_set(ends_at), sa.EXPIRING.value_set(expiring)]

    def publish_end(self, ends_at: datetime | None, expiring: bool) -> None:
        """The allocation's end and the warning, in an upsert of their own (an extension, a warning)."""
        if ends := self.end_values(ends_at, expiring):
            workflow.upsert_search_attributes(ends)

    def open(self) -> None:
        """Start the trail with the allocation's row, written with the first step."""
        self.trail = AuditTrail(opening=self.state.input.opening(workflow.info().workflow_id))

    async def control_step(
        self, step: Callable[[Any], Awaitable[R]], argument: BaseModel, deadline: timedelta | None
    ) -> R:
        """Run a control step as a local activity (no task-queue round trip, no activity task on the server), handing
        it the unwritten trail to write before its own work. If the step fails the trail goes back in line for the
        next write (writing a step twice changes nothing). A local activity's failure is raised as an activity's, as
        every caller reads `ActivityError.cause`."""
        trail = self.take_trail()
        try:
            try:
                return await control_calls.local(step, argument.model_copy(update={"trail": trail}), deadline=deadline)
            except (ApplicationError, TimeoutError) as bare:
                raise as_activity_error(step.__name__) from bare
        except BaseException:
            self.put_back(trail)
            raise

    def take_trail(self) -> AuditTrail:
        """Hand the unwritten steps to the control step about to run, which writes them first."""
        trail, self.trail = self.trail, AuditTrail()
        return trail

    def put_back(self, trail: AuditTrail) -> None:
        """A control step that failed did not write its trail: it goes back in line for the next write (writing a
        step twice changes nothing)."""
        self.trail = AuditTrail(
            opening=trail.opening or self.trail.opening, changes=[*trail.changes, *self.trail.changes]
        )

    async def write_trail(self) -> None:
        """Write the unwritten steps now: the workflow is about to wait with no control step ahead."""
        if self.trail:
            await control_calls.local(steps.record_trail, self.take_trail())

    def story(self) -> str:
        """The markdown the Temporal UI shows as this allocation's current details."""
        s, input = self.state.status, self.state.input
        lines = [
            f"**{s.state}** ({s.step}) - {input.request.describe()} for tenant {s.tenant}"
            + (f", asked by {input.actor}" if input.actor else ""),
            "",
            f"region: {s.region or '-'} | pool: {s.pool or '-'} | node: {s.node or '-'}",
        ]
        if s.bundles:
            slots = ", ".join(f"{b.slot_id} (GPU {b.gpu_pci})" for b in s.bundles)
            lines += ["", f"bundles: {slots}"]
        if s.attempts:
            lines += ["", "| attempt | node | outcome | reason |", "| --- | --- | --- | --- |"]
            lines += [f"| {a.number} | {a.node} | {a.outcome} | {a.reason or ''} |" for a in s.attempts]
        held = input.held
        if held is not None and held.previous_run_id is not None:
            lines += [
                "",
                f"This run continues the hold of run `{held.previous_run_id}` ({held.handed_over_because}). The steps "
                "that placed it are in the first run of this workflow id: Relationships, or the allocation's events "
                "(`berth alloc get`).",
            ]
        if s.ends_at is not None and s.state == "active":
            lines += [
                "",
                f"ends at {s.ends_at.isoformat()}" + (" (its owner has been warned)" if s.expiry_warned else ""),
            ]
        if s.state == "queued" and s.waiting_reason:
            lines += ["", f"waiting in {s.region}'s queue: {s.waiting_reason}"]
        if s.failure_reason:
            lines += ["", f"failure: {s.failure_reason}"]
        return "\n".join(lines)


def initial_search_attributes(input: AllocationInput) -> TypedSearchAttributes:
    """What the UI shows of an allocation from its start (the client sets them when it starts the workflow)."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(sa.KIND, "allocation"),
        SearchAttributePair(sa.STATE, STARTED_AS),
        SearchAttributePair(sa.TENANT, input.tenant),
        SearchAttributePair(sa.GPU_COUNT, input.request.gpu_count),
        SearchAttributePair(sa.REGION, input.request.region or ""),
        SearchAttributePair(sa.NODE, ""),
    ]
    if input.actor is not None:
        pairs.append(SearchAttributePair(sa.ACTOR, input.actor))
    return TypedSearchAttributes(pairs)


def search_attributes_of(
    input: AllocationInput, status: AllocationStatus, published: dict[str, str]
) -> TypedSearchAttributes:
    """What the UI shows of a held allocation, for the fresh run a hold hands over to: the values its run published,
    its end and whether its owner was warned."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(sa.KIND, "allocation"),
        SearchAttributePair(sa.STATE, published.get(sa.STATE.name, status.state)),
        SearchAttributePair(sa.TENANT, input.tenant),
        SearchAttributePair(sa.GPU_COUNT, input.request.gpu_count),
        SearchAttributePair(sa.REGION, published.get(sa.REGION.name, status.region or "")),
        SearchAttributePair(sa.NODE, published.get(sa.NODE.name, status.node or "")),
    ]
    if input.actor is not None:
        pairs.append(SearchAttributePair(sa.ACTOR, input.actor))
    if status.ends_at is not None:
        pairs += [
            SearchAttributePair(sa.ENDS_AT, status.ends_at),
            SearchAttributePair(sa.EXPIRING, status.expiry_warned),
        ]
    return TypedSearchAttributes(pairs)
