"""What the API reads and writes of allocations (`allocations`, their events and claims), beside the workflow's own
writes (store/trail.py, store/claims.py).

The API writes an allocation's row only twice, both best effort: when Temporal has accepted the create (so that
reads find it at once; the workflow writes the same row as its first step) and when a failed allocation is started
again (its row goes back to `pending`; the new run's trail says the same a step later). Everything else it reads.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import AllocationEventRow, AllocationRow, ClaimRow, PoolRow, TenantRow

# An allocation row with its pool's cluster and name (the row keeps only the pool's id): what a summary shows.
WithPool = Row[tuple[AllocationRow, str | None, str | None]]


async def load_tenant(session: AsyncSession, tenant: str) -> TenantRow | None:
    """The tenant's row (its quota and rate limit); None for a tenant the fleet does not have."""
    return await session.get(TenantRow, tenant)


async def by_idempotency_key(session: AsyncSession, tenant: str, key: str) -> AllocationRow | None:
    """The allocation an earlier request of the tenant created with this Idempotency-Key, if any."""
    return await session.scalar(
        select(AllocationRow).where(AllocationRow.tenant == tenant, AllocationRow.idempotency_key == key)
    )


async def record_restarted(session: AsyncSession, allocation_id: str) -> None:
    """A failed allocation started again: its row is `pending` once more, without the previous run's failure and
    placement. A row that is no longer `failed` (the new run's trail came first) is left alone."""
    await session.execute(
        update(AllocationRow)
        .where(AllocationRow.id == allocation_id, AllocationRow.state == "failed")
        .values(state="pending", failure_reason=None, node_id=None, pool_id=None)
    )


async def record_end(session: AsyncSession, allocation_id: str, ends_at: datetime) -> None:
    """An extension its workflow accepted, written under the placement lock it was decided under (its trail writes
    the same end a moment later), so that a reservation admitted next counts the allocation until its new end."""
    await session.execute(
        update(AllocationRow)
        .where(AllocationRow.id == allocation_id, AllocationRow.state.in_(("active", "expiring")))
        .values(ends_at=ends_at)
    )


async def load_allocation(session: AsyncSession, allocation_id: str) -> AllocationRow | None:
    return await session.get(AllocationRow, allocation_id)


def _with_pool() -> Select[tuple[AllocationRow, str | None, str | None]]:
    return select(AllocationRow, PoolRow.cluster, PoolRow.name).outerjoin(PoolRow, PoolRow.id == AllocationRow.pool_id)


async def allocation_page(
    session: AsyncSession,
    *,
    state: str | None = None,
    region: str | None = None,
    node: str | None = None,
    tenant: str | None = None,
    visible_to: frozenset[str] | None = None,
    before: tuple[datetime, str] | None = None,
    limit: int,
) -> Sequence[WithPool]:
    """Up to `limit` allocations with their pools, newest first by `(created_at, id)`, each filter applied when
    given; `visible_to`: only these tenants' (what the caller may see; none for a caller in no tenant); `before`: the page starts after that position
    (a keyset page, which the `(tenant, created_at, id)` and `(created_at, id)` indexes serve without sorting)."""
    query = _with_pool()
    for column, value in (
        (AllocationRow.state, state),
        (AllocationRow.region, region),
        (AllocationRow.node_id, node),
        (AllocationRow.tenant, tenant),
    ):
        if value is not None:
            query = query.where(column == value)
    if visible_to is not None:
        query = query.where(AllocationRow.tenant.in_(sorted(visible_to)))
    if before is not None:
        query = query.where(tuple_(AllocationRow.created_at, AllocationRow.id) < before)
    query = query.order_by(AllocationRow.created_at.desc(), AllocationRow.id.desc()).limit(limit)
    return (await session.execute(query)).all()


async def events_of(session: AsyncSession, allocation_id: str) -> list[AllocationEventRow]:
    """The allocation's audit trail, every run's, in the order it was written."""
    return list(
        (
            await session.scalars(
                select(AllocationEventRow)
                .where(AllocationEventRow.allocation_id == allocation_id)
                .order_by(AllocationEventRow.id)
            )
        ).all()
    )


async def tenants_of(session: AsyncSession, allocation_ids: Collection[str]) -> dict[str, str]:
    """allocation id -> its tenant, for those of `allocation_ids` that exist."""
    rows = await session.execute(
        select(AllocationRow.id, AllocationRow.tenant).where(AllocationRow.id.in_(allocation_ids))
    )
    return {allocation: tenant for allocation, tenant in rows.all()}


async def pool_name(session: AsyncSession, pool_id: int | None) -> tuple[str, str] | None:
    """The pool's cluster and name; None for no pool (or one pruned since)."""
    row = (await session.execute(select(PoolRow.cluster, PoolRow.name).where(PoolRow.id == pool_id))).first()
    return (row[0], row[1]) if row is not None else None


async def held_bundles(session: AsyncSession, allocation_id: str) -> list[dict[str, Any]]:
    """The bundles of the allocation's active claims, as recorded, in claim order."""
    return list(
        await session.scalars(
            select(ClaimRow.bundle)
            .where(ClaimRow.allocation_id == allocation_id, ClaimRow.released_at.is_(None))
            .order_by(ClaimRow.id)
        )
    )


async def count_by_state(session: AsyncSession) -> dict[str, int]:
    """How many allocations are in each state (states with none are absent)."""
    rows = await session.execute(select(AllocationRow.state, func.count()).group_by(AllocationRow.state))
    return {state: count for state, count in rows.all()}


async def failures_by_reason(session: AsyncSession) -> list[tuple[str | None, int]]:
    """Failed allocations counted by their exact failure reason (the API groups them by the reason's code)."""
    rows = await session.execute(
        select(AllocationRow.failure_reason, func.count())
        .where(AllocationRow.state == "failed")
        .group_by(AllocationRow.failure_reason)
    )
    return [(reason, count) for reason, count in rows.all()]
