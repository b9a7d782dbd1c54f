"""The allocation's row and its audit trail (`allocations`, `allocation_events`), written as the workflow hands them
over: one statement per trail, in a transaction of its own.

Temporal's history is the source of truth while an allocation is in flight, but it is dropped after the namespace's
retention; `allocation_events` keeps the story for as long as the platform team needs it. The control activities
(activities/control/) call `write_trail` before their own work, and the local activity `record_trail` before a wait.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import delete, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from contracts.allocation import AllocationRecord, AuditTrail, StateChange
from store.liveness import mark_down
from store.models import AllocationEventRow, AllocationRow

AGENT_UNREACHABLE = "agent_unreachable"


# A trail in one statement, whatever it holds: the row opened (already at its newest state) if the workflow says so
# and it is not there yet, brought to its newest state if it was, the steps appended once each, and the steps the
# writer retracts removed. A row inserted by the same statement is invisible to its UPDATE (one snapshot), which is
# why the INSERT carries the newest state itself; the events' foreign key is checked at the end of the statement,
# when the row exists. Written out once: a
# statement built from SQLAlchemy expressions per trail cost the control worker more CPU than PostgreSQL spent on it
# (docs/benchmarks.md, "The cost per part").
_WRITE_TRAIL = text(
    "WITH opened AS ("
    " INSERT INTO allocations (id, tenant, state, shape, gpu_count, gpu_product, request, workflow_id,"
    "  idempotency_key, region, node_id, pool_id, failure_reason, updated_at, requested_by)"
    " SELECT :id, :tenant, :state, :shape, :gpu_count, :gpu_product, CAST(:request AS jsonb), :workflow_id,"
    "  :idempotency_key, :region, :node, (SELECT p.id FROM pools AS p WHERE p.cluster = :cluster AND p.name = :pool),"
    "  :failure_reason, coalesce(:at, now()), :requested_by"
    " WHERE :opening"
    " ON CONFLICT DO NOTHING RETURNING 1"  # the API wrote it first (by id), or with the same Idempotency-Key
    "), mirrored AS ("
    " UPDATE allocations SET state = :state, updated_at = coalesce(:at, now()),"
    "  region = CASE WHEN :set_region THEN :region ELSE region END,"
    "  node_id = CASE WHEN :set_node THEN :node ELSE node_id END,"
    "  pool_id = CASE WHEN :set_pool"
    "   THEN (SELECT p.id FROM pools AS p WHERE p.cluster = :cluster AND p.name = :pool) ELSE pool_id END,"
    "  failure_reason = CASE WHEN :set_reason THEN :failure_reason ELSE failure_reason END,"
    "  ends_at = CASE WHEN :set_ends_at THEN CAST(:ends_at AS timestamptz) ELSE ends_at END"
    " WHERE id = :id AND :mirror RETURNING 1"
    "), appended AS ("
    " INSERT INTO allocation_events (allocation_id, event_key, at, state, step, attempt, node_id, reason, detail,"
    "  actor)"
    " SELECT :id, e.event_key, coalesce(e.at, now()), e.state, e.step, e.attempt, e.node_id, e.reason, e.detail,"
    "  e.actor"
    " FROM jsonb_to_recordset(CAST(:events AS jsonb)) AS e(event_key text, at timestamptz, state text, step text,"
    "  attempt integer, node_id text, reason text, detail jsonb, actor text)"
    " ON CONFLICT (allocation_id, event_key) DO NOTHING"  # the key makes a trail written twice change nothing
    "), retracted AS ("
    " DELETE FROM allocation_events WHERE allocation_id = :id AND event_key = ANY(CAST(:retract AS text[]))"
    ") SELECT (SELECT count(*) FROM opened), (SELECT count(*) FROM mirrored)"
)


async def write_trail(
    sessions: async_sessionmaker[AsyncSession], trail: AuditTrail, retract: StateChange | None = None
) -> None:
    """Write a trail in one transaction of its own, so that a step refused afterwards (a claim conflict, say) cannot
    roll its story back. One statement, however long the trail; nothing to write costs nothing.

    `retract`: a step an earlier try of the same activity may have written before its result was lost (a worker
    that crashed before the workflow task completed), and that this try may not take: it is removed with the write.
    It must not be one of the trail's own steps."""
    if not trail:
        return
    async with sessions.begin() as session:
        await write_trail_in(session, trail, retract)


async def write_trail_in(session: AsyncSession, trail: AuditTrail, retract: StateChange | None = None) -> None:
    """`write_trail` inside the caller's transaction, for a step whose story must commit with its work (a release
    and the final state it brings)."""
    if not trail:
        return
    parameters = _trail_parameters(trail) | {"retract": [event_key(retract)] if retract is not None else []}
    opened, mirrored = (await session.execute(_WRITE_TRAIL, parameters)).one()
    if trail.opening is not None and trail.changes and opened == 0 and mirrored == 0:
        # The API's opening of the row committed while this statement waited on its key: the INSERT gave way to
        # it, but the UPDATE's snapshot, taken before, could not see it. A new statement sees it.
        opened, mirrored = (await session.execute(_WRITE_TRAIL, parameters)).one()
    if trail.changes and opened == 0 and mirrored == 0:
        raise ValueError(f"allocation {trail.changes[-1].allocation_id} has no row; its trail must open it first")
    await _mark_unreachable_agents_down(session, trail.changes)


async def open_row(session: AsyncSession, opening: AllocationRecord) -> str:
    """Open the allocation's row with the statement its trail's first write runs, ahead of the workflow, so that a
    read finds it at once (the API's create, a reservation's start): whichever of the two comes second changes
    nothing. The row's state, whoever wrote it."""
    await write_trail_in(session, AuditTrail(opening=opening))
    state = await session.scalar(select(AllocationRow.state).where(AllocationRow.id == opening.allocation_id))
    return state or "pending"


def _trail_parameters(trail: AuditTrail) -> dict[str, Any]:
    """The statement's parameters: the row as the newest change leaves it (each field as the last change that set
    it), the opening's columns, and the steps as one JSON array."""
    opening, changes = trail.opening, trail.changes
    latest = changes[-1] if changes else None
    region = node = pool = reason = ends_at = None
    set_region = set_node = set_pool = set_reason = set_ends_at = False
    for change in changes:
        if change.ends_at is not None:
            ends_at, set_ends_at = change.ends_at, True
        if change.region is not None:
            region, set_region = change.region, True
        if change.node is not None:
            node, set_node = change.node, True
        if change.pool is not None:
            pool, set_pool = change.pool, True
        if change.state == "failed" and change.reason:
            reason, set_reason = change.reason, True
        elif change.state != "failed":
            reason, set_reason = None, True  # a failed allocation retried: the reason was the previous run's
    cluster, _, pool_name = (pool or "").partition("/")
    request = opening.request if opening is not None else None
    events = [
        {
            "event_key": event_key(change),
            "at": change.at.isoformat() if change.at else None,
            "state": change.state,
            "step": change.step,
            "attempt": change.attempt,
            "node_id": change.node,
            "reason": change.reason,
            "detail": change.detail,
            "actor": change.actor,
        }
        for change in changes
    ]
    return {
        "id": opening.allocation_id if opening is not None else changes[0].allocation_id,
        "opening": opening is not None,
        "mirror": latest is not None,
        "tenant": opening.tenant if opening is not None else None,
        "state": latest.state if latest is not None else "pending",
        "shape": request.shape.value if request is not None else None,
        "gpu_count": request.gpu_count if request is not None else None,
        "gpu_product": request.gpu_product if request is not None else None,
        "request": json.dumps(
            (opening.request_body or request.model_dump(mode="json")) if opening and request else None
        ),
        "workflow_id": opening.workflow_id if opening is not None else None,
        "requested_by": opening.requested_by if opening is not None else None,
        "idempotency_key": opening.idempotency_key if opening is not None else None,
        "at": latest.at if latest is not None else None,
        "region": region,
        "node": node,
        "cluster": cluster,
        "pool": pool_name,
        "failure_reason": reason,
        "set_region": set_region,
        "set_node": set_node,
        "set_pool": set_pool,
        "set_reason": set_reason,
        "ends_at": ends_at,
        "set_ends_at": set_ends_at,
        "events": json.dumps(events),
    }


# Steps a run may take more than once (a queued request woken, refused after all, queued again; an end extended and
# warned of again): told apart by
# the workflow's time of the step, which a retried write of the same step repeats.
REPEATABLE_STEPS = frozenset({"enter_queue", "woken", "extended", "expiring"})


def event_key(change: StateChange) -> str:
    """A step's identity within its allocation: the same step written again is the same event."""
    key = f"{change.run_id}:{change.step}:{change.state}:{change.attempt or 0}:{change.node or '-'}"
    if change.step in REPEATABLE_STEPS and change.at is not None:
        key += f":{change.at.isoformat()}"
    return key


async def _mark_unreachable_agents_down(session: AsyncSession, changes: list[StateChange]) -> None:
    """An agent that let a task sit past its pickup timeout is taken out of ranking at once (not after its reports
    expire), so the next allocation does not pay the same timeout; its next report brings it back."""
    for change in changes:
        if change.step == "attempt_failed" and change.node and (change.reason or "").startswith(AGENT_UNREACHABLE):
            await mark_down(session, change.node, change.reason or AGENT_UNREACHABLE, at=change.at)


REQUEST_PREFIX = "request:"  # the key of a request's event; a workflow's steps begin with its run id


async def record_request(session: AsyncSession, allocation_id: str, state: str, step: str, actor: str) -> str:
    """A request a person or a service account made of an allocation (`release_requested`, `cancel_requested`,
    ...), with who made it, written before the workflow's own steps that carry it out. The event's key, to retract
    it with."""
    key = f"{REQUEST_PREFIX}{step}:{uuid.uuid4().hex}"
    await session.execute(
        insert(AllocationEventRow).values(
            allocation_id=allocation_id, event_key=key, state=state, step=step, actor=actor, detail={}
        )
    )
    return key


async def was_requested(session: AsyncSession, allocation_id: str, step: str) -> bool:
    """Whether someone asked for `step` (`cancel_requested`, ...) of this allocation and it was not taken back."""
    found = await session.scalar(
        select(AllocationEventRow.id)
        .where(
            AllocationEventRow.allocation_id == allocation_id,
            AllocationEventRow.step == step,
            AllocationEventRow.event_key.startswith(REQUEST_PREFIX),
        )
        .limit(1)
    )
    return found is not None


async def retract_request(session: AsyncSession, allocation_id: str, key: str) -> None:
    """The request was refused (the workflow's validator said no): it did not happen, and the 4xx says why."""
    await session.execute(
        delete(AllocationEventRow).where(
            AllocationEventRow.allocation_id == allocation_id, AllocationEventRow.event_key == key
        )
    )
