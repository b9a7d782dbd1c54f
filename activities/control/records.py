"""The allocation's row and its audit trail in PostgreSQL, kept in step with the workflow.

Temporal's history is the source of truth while an allocation is in flight, but it is dropped after the namespace's
retention; `allocation_events` keeps the story for as long as the platform team needs it.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.contracts import AllocationRecord, StateChange
from store.models import AllocationEventRow, AllocationRow, PoolRow


class RecordActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    @activity.defn(name="open_allocation")
    async def open_allocation(self, record: AllocationRecord) -> None:
        """Create the allocation's row if it does not exist (the API may have created it already)."""
        request = record.request
        async with self.sessions.begin() as session:
            await session.execute(
                insert(AllocationRow)
                .values(
                    id=record.allocation_id,
                    tenant=record.tenant,
                    state="pending",
                    shape=request.shape.value,
                    gpu_count=request.gpu_count,
                    gpu_product=request.gpu_product,
                    request=record.request_body or request.model_dump(mode="json"),
                    workflow_id=record.workflow_id,
                )
                .on_conflict_do_nothing(index_elements=[AllocationRow.id])
            )

    @activity.defn(name="record_state")
    async def record_state(self, change: StateChange) -> None:
        """Mirror the new state into the allocation's row and append the step to its events, once.

        Two statements in one transaction, no read first: this runs at every step of every allocation."""
        values: dict[str, object] = {"state": change.state, "updated_at": func.now()}
        if change.region is not None:
            values["region"] = change.region
        if change.node is not None:
            values["node_id"] = change.node
        if change.pool is not None:
            cluster, _, pool = change.pool.partition("/")
            values["pool_id"] = (
                select(PoolRow.id).where(PoolRow.cluster == cluster, PoolRow.name == pool).scalar_subquery()
            )
        if change.state == "failed" and change.reason:
            values["failure_reason"] = change.reason
        key = f"{change.run_id}:{change.step}:{change.state}:{change.attempt or 0}:{change.node or '-'}"
        async with self.sessions.begin() as session:
            updated = await session.execute(
                update(AllocationRow).where(AllocationRow.id == change.allocation_id).values(**values)
            )
            if updated.rowcount == 0:
                raise ValueError(f"allocation {change.allocation_id} has no row; open_allocation must run first")
            await session.execute(
                insert(AllocationEventRow)
                .values(
                    allocation_id=change.allocation_id,
                    event_key=key,
                    state=change.state,
                    step=change.step,
                    attempt=change.attempt,
                    node_id=change.node,
                    reason=change.reason,
                    detail=change.detail,
                )
                .on_conflict_do_nothing(index_elements=[AllocationEventRow.allocation_id, AllocationEventRow.event_key])
            )

    def activities(self) -> list[object]:
        return [self.open_allocation, self.record_state]
