"""An allocation as the API shows it: its PostgreSQL row and audit trail, overlaid with the running workflow's live
status when it answers.

PostgreSQL outlives Temporal's retention, so everything can be read from it alone: attempts are rebuilt from the
events the workflow appends at every step (each keyed by the run that wrote it, so a failed allocation that was
retried shows the attempts of every run). While the workflow runs, its status query is fresher by up to one step
and names the step in progress, so it wins for the run in progress; a workflow that cannot answer quickly is not
waited for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from api import queue_view
from api.errors import not_found
from api.services import Services
from api.temporal import OutcomeUnknown
from contracts.allocation import FINAL_STATES
from contracts.http import AllocationDetail, AllocationSummary, AttemptView, EventView
from contracts.placement import Bundle
from store import allocations as store
from store import trail
from store.db import AsyncSession
from store.inventory import InventoryCache
from store.models import AllocationEventRow, AllocationRow
from store.tokens import Principal
from workflows.allocation.messages import AllocationStatus


async def visible_allocation(session: AsyncSession, allocation_id: str, caller: Principal) -> AllocationRow:
    """The allocation if the caller may see it; otherwise 404, whether it exists or belongs to someone else."""
    row = await store.load_allocation(session, allocation_id)
    if row is None or not caller.may_see(row.tenant):
        raise not_found("allocation", allocation_id)
    return row


@asynccontextmanager
async def requested(app: Services, row: AllocationRow, step: str, caller: Principal) -> AsyncIterator[None]:
    """Record who asks for `step` in the allocation's trail before the workflow is asked, so the trail names them
    ahead of the steps that carry it out. A request known not to have been carried out (refused, or never sent) is
    taken back out; one whose answer was lost (`OutcomeUnknown`) stays, since the workflow may still carry it out
    and the trail must then say who asked."""
    async with app.sessions.begin() as session:
        key = await trail.record_request(session, row.id, row.state, step, caller.actor)
    try:
        yield
    except OutcomeUnknown:
        raise
    except BaseException:
        async with app.sessions.begin() as session:
            await trail.retract_request(session, row.id, key)
        raise


def summary(row: AllocationRow, cluster: str | None, pool: str | None) -> AllocationSummary:
    return AllocationSummary(
        id=row.id,
        tenant=row.tenant,
        state=row.state,
        shape=row.shape,
        gpu_count=row.gpu_count,
        gpu_product=row.gpu_product,
        region=row.region,
        pool=f"{cluster}/{pool}" if cluster and pool else None,
        node=row.node_id,
        failure_reason=row.failure_reason,
        borrowed_gpus=row.borrowed_gpus,
        ends_at=row.ends_at,
        workflow_id=row.workflow_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def attempts(events: list[AllocationEventRow], ended: bool, live: AllocationStatus | None) -> list[AttemptView]:
    """Every attempt of every run, oldest first.

    Runs that are over (their events include a final state) are read from their events; an attempt with no ending
    event there was cut short: cancelled. The run in progress is the live status's own account when the workflow
    answered (its events may lag a step behind), else read from its events like the others."""
    runs: dict[str, dict[int, AttemptView]] = {}
    over: set[str] = set()
    for event in events:
        if event.event_key.startswith(trail.REQUEST_PREFIX):
            continue  # a request someone made (`record_request`), not a run's step
        run = event.event_key.split(":", 1)[0]
        tried = runs.setdefault(run, {})
        if event.state in FINAL_STATES:
            over.add(run)
        if event.attempt is None:
            continue
        attempt = tried.setdefault(
            event.attempt, AttemptView(number=event.attempt, node=event.node_id, outcome="running", reason=None)
        )
        if event.step == "attempt_failed":
            abandoned = (event.reason or "").startswith("operator_retry")
            attempt.outcome, attempt.reason = ("abandoned" if abandoned else "failed"), event.reason
        elif event.step == "ready":
            attempt.outcome = "succeeded"
    result: list[AttemptView] = []
    last = list(runs)[-1] if runs else None
    for run, tried in runs.items():
        if live is not None and run not in over:
            continue
        for attempt in tried.values():
            if attempt.outcome == "running" and (ended or run in over or run != last):
                attempt.outcome = "cancelled"
            result.append(attempt)
    if live is not None:
        result += [AttemptView(number=a.number, node=a.node, outcome=a.outcome, reason=a.reason) for a in live.attempts]
    return result


def _shown_to(caller: Principal | None, row: AllocationRow) -> str | None:
    """Whose eyes the queue's reasons are written for: None for an admin (every id), else a tenant."""
    if caller is None:
        return row.tenant
    return None if caller.sees_all else row.tenant if caller.may_see(row.tenant) else ""


async def detail(
    session: AsyncSession,
    row: AllocationRow,
    live: AllocationStatus | None,
    caller: Principal | None = None,
    inventory: InventoryCache | None = None,
) -> AllocationDetail:
    """`caller`: whose read it is (a tenant is not shown other tenants' ids in the queue's reasons; None reads as
    the allocation's own tenant). `inventory`: the app's cache, when the caller has it."""
    events = await store.events_of(session, row.id)
    pool = await store.pool_name(session, row.pool_id)
    base = summary(row, *(pool or (None, None)))
    if live is not None:
        base = base.model_copy(
            update={
                "state": live.state,
                "region": live.region,
                "pool": live.pool,
                "node": live.node,
                "failure_reason": live.failure_reason or base.failure_reason,
                "ends_at": live.ends_at if live.state == "active" else base.ends_at,
            }
        )
        bundles = list(live.bundles)
    else:
        bundles = [Bundle.model_validate(bundle) for bundle in await store.held_bundles(session, row.id)]
    return AllocationDetail(
        **base.model_dump(),
        step=live.step if live is not None else None,
        requested_by=row.requested_by,
        live=live is not None,
        bundles=bundles,
        attempts=attempts(events, ended=base.state in FINAL_STATES, live=live),
        events=[
            EventView(
                at=e.at, state=e.state, step=e.step, attempt=e.attempt, node=e.node_id, reason=e.reason, actor=e.actor
            )
            for e in events
        ],
        queue=await queue_view.place_of(session, row.id, _shown_to(caller, row), inventory),
    )
