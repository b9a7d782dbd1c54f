"""The allocation's row and its audit trail in PostgreSQL, kept in step with the workflow.

Temporal's history is the source of truth while an allocation is in flight, but it is dropped after the namespace's
retention; `allocation_events` keeps the story for as long as the platform team needs it.

The workflow hands over its steps as an `AuditTrail`: usually inside the input of the next control activity, which
calls `write_trail` before its own work, and as the local activity `record_trail` before a wait that no control
step follows (readiness, holding an active allocation, the end of the run). `open_allocation` and `record_state`
are the per-step activities of workflows started before the trail existed; they stay registered so those runs
replay and finish.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.contracts import AllocationRecord, AuditTrail, StateChange
from store.liveness import mark_down
from store.models import AllocationEventRow, AllocationRow, PoolRow

# Plain table statements: the ORM's bulk-DML layer costs more than the statements themselves on this hot path.
AGENT_UNREACHABLE = "agent_unreachable"
ALLOCATIONS = AllocationRow.__table__
EVENTS = AllocationEventRow.__table__
POOLS = PoolRow.__table__


async def write_trail(sessions: async_sessionmaker[AsyncSession], trail: AuditTrail) -> None:
    """Write a trail in one transaction of its own, so that a step refused afterwards (a claim conflict, say) cannot
    roll its story back. At most three statements, however long the trail; nothing to write costs nothing."""
    if not trail:
        return
    async with sessions.begin() as session:
        if trail.opening is not None:
            await _open(session, trail.opening)
        if trail.changes:
            await _mirror_latest(session, trail.changes)
            await _append_events(session, trail.changes)
            await _mark_unreachable_agents_down(session, trail.changes)


async def _mark_unreachable_agents_down(session: AsyncSession, changes: list[StateChange]) -> None:
    """An agent that let a task sit past its pickup timeout is taken out of ranking at once (not after its reports
    expire), so the next allocation does not pay the same timeout; its next report brings it back."""
    for change in changes:
        if change.step == "attempt_failed" and change.node and (change.reason or "").startswith(AGENT_UNREACHABLE):
            await mark_down(session, change.node, change.reason or AGENT_UNREACHABLE, at=change.at)


async def _open(session: AsyncSession, record: AllocationRecord) -> None:
    """Create the allocation's row if it does not exist (the API may have created it already)."""
    request = record.request
    await session.execute(
        insert(ALLOCATIONS)
        .values(
            id=record.allocation_id,
            tenant=record.tenant,
            state="pending",
            shape=request.shape.value,
            gpu_count=request.gpu_count,
            gpu_product=request.gpu_product,
            request=record.request_body or request.model_dump(mode="json"),
            workflow_id=record.workflow_id,
            idempotency_key=record.idempotency_key,
        )
        .on_conflict_do_nothing()  # the API wrote it first (by id), or with the same Idempotency-Key
    )


async def _mirror_latest(session: AsyncSession, changes: list[StateChange]) -> None:
    """Bring the allocation's row to the newest of the changes (each field as the last change that set it)."""
    latest = changes[-1]
    values: dict[str, object] = {"state": latest.state, "updated_at": latest.at or func.now()}
    for change in changes:
        if change.region is not None:
            values["region"] = change.region
        if change.node is not None:
            values["node_id"] = change.node
        if change.pool is not None:
            values["pool"] = change.pool
        if change.state == "failed" and change.reason:
            values["failure_reason"] = change.reason
        elif change.state != "failed":
            values["failure_reason"] = None  # a failed allocation retried: the reason was the previous run's
    if "pool" in values:
        cluster, _, pool = str(values.pop("pool")).partition("/")
        values["pool_id"] = select(POOLS.c.id).where(POOLS.c.cluster == cluster, POOLS.c.name == pool).scalar_subquery()
    updated = await session.execute(update(ALLOCATIONS).where(ALLOCATIONS.c.id == latest.allocation_id).values(values))
    if updated.rowcount == 0:
        raise ValueError(f"allocation {latest.allocation_id} has no row; its trail must open it first")


async def _append_events(session: AsyncSession, changes: list[StateChange]) -> None:
    """One event row per step, once: the key makes a trail written twice change nothing."""
    rows: list[dict[str, Any]] = [
        {
            "allocation_id": change.allocation_id,
            "event_key": f"{change.run_id}:{change.step}:{change.state}:{change.attempt or 0}:{change.node or '-'}",
            "at": change.at or func.now(),
            "state": change.state,
            "step": change.step,
            "attempt": change.attempt,
            "node_id": change.node,
            "reason": change.reason,
            "detail": change.detail,
        }
        for change in changes
    ]
    await session.execute(
        insert(EVENTS).values(rows).on_conflict_do_nothing(index_elements=[EVENTS.c.allocation_id, EVENTS.c.event_key])
    )


class RecordActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    @activity.defn(name="record_trail")
    async def record_trail(self, trail: AuditTrail) -> None:
        """Write the steps taken since the last control activity (a local activity, before a wait)."""
        await write_trail(self.sessions, trail)

    @activity.defn(name="open_allocation")
    async def open_allocation(self, record: AllocationRecord) -> None:
        """Runs started before the trail existed: create the allocation's row if it is missing."""
        await write_trail(self.sessions, AuditTrail(opening=record))

    @activity.defn(name="record_state")
    async def record_state(self, change: StateChange) -> None:
        """Runs started before the trail existed: one step."""
        await write_trail(self.sessions, AuditTrail(changes=[change]))

    def activities(self) -> list[object]:
        return [self.record_trail, self.open_allocation, self.record_state]
