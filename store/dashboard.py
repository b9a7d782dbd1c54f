"""What an on-call person's dashboard and alerts read: capacity by pool, agents, allocations stuck in a
state, how long placement takes. Read from PostgreSQL at scrape time (api/metrics.py), so every API replica reports
the same truth.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.allocation import FINAL_STATES
from store.models import AllocationEventRow, AllocationRow, NodeAgentRow, NodeRow, PoolRow, SlotRow

PLACEMENT_WINDOW = timedelta(hours=1)  # the placements the latency quantiles are taken over


async def slot_counts(session: AsyncSession, now: datetime | None = None) -> list[tuple[str, str, int]]:
    """(pool `cluster/name`, state, slots) for the approved slots of slice and bare-metal pools: `free` (available),
    `placeable` (free, validated, healthy, on a READY node whose agent is live: what the next decision may take),
    `reserved` (held by an allocation, a plan or a reservation) and `quarantined`."""
    now = now or datetime.now(UTC)
    live = and_(NodeAgentRow.state == "live", NodeAgentRow.expires_at > now)
    placeable = and_(
        SlotRow.state == "available",
        SlotRow.validation == "valid",
        SlotRow.health == "healthy",
        NodeRow.status == "READY",
        live,
    )
    rows = await session.execute(
        select(
            PoolRow.cluster,
            PoolRow.name,
            SlotRow.state,
            func.count(),
            func.count(case((placeable, 1))),
        )
        .join(NodeRow, NodeRow.name == SlotRow.node_id)
        .join(PoolRow, PoolRow.id == NodeRow.pool_id)
        .outerjoin(NodeAgentRow, NodeAgentRow.node == NodeRow.name)
        .where(SlotRow.approved.is_(True))
        .group_by(PoolRow.cluster, PoolRow.name, SlotRow.state)
    )
    counted: dict[tuple[str, str], int] = {}
    for cluster, name, state, count, placeable_count in rows:
        pool = f"{cluster}/{name}"
        for key, value in (
            ((pool, "free" if state == "available" else state), count),
            ((pool, "placeable"), placeable_count),
        ):
            counted[key] = counted.get(key, 0) + int(value)
    return [(pool, state, count) for (pool, state), count in sorted(counted.items())]


async def agents_by_state(session: AsyncSession) -> dict[str, int]:
    rows = await session.execute(select(NodeAgentRow.state, func.count()).group_by(NodeAgentRow.state))
    return {state: int(count) for state, count in rows}


async def allocations_on_down_agents(session: AsyncSession) -> list[tuple[str, int]]:
    """(node, unfinished allocations on it) for each node whose agent is down: what an agent outage puts at risk."""
    rows = await session.execute(
        select(AllocationRow.node_id, func.count())
        .join(NodeAgentRow, NodeAgentRow.node == AllocationRow.node_id)
        .where(NodeAgentRow.state == "down", AllocationRow.state.not_in(FINAL_STATES))
        .group_by(AllocationRow.node_id)
        .order_by(AllocationRow.node_id)
    )
    return [(node, int(count)) for node, count in rows]


async def oldest_in_state(session: AsyncSession, now: datetime | None = None) -> list[tuple[str, float]]:
    """(state, seconds) of the allocation longest in each unfinished state, since its row last changed."""
    now = now or datetime.now(UTC)
    rows = await session.execute(
        select(AllocationRow.state, func.min(AllocationRow.updated_at))
        .where(AllocationRow.state.not_in(FINAL_STATES))
        .group_by(AllocationRow.state)
    )
    return [(state, max((now - oldest).total_seconds(), 0.0)) for state, oldest in rows]


async def placement_seconds(
    session: AsyncSession, quantiles: tuple[float, ...] = (0.5, 0.9, 0.99), now: datetime | None = None
) -> tuple[int, dict[float, float]]:
    """How long the allocations that became active within the last hour took from their create to `active`:
    (how many, {quantile: seconds})."""
    since = (now or datetime.now(UTC)) - PLACEMENT_WINDOW
    first_active = (
        select(AllocationEventRow.allocation_id, func.min(AllocationEventRow.at).label("at"))
        .where(AllocationEventRow.state == "active")
        .group_by(AllocationEventRow.allocation_id)
        .subquery()
    )
    took = func.extract("epoch", first_active.c.at - AllocationRow.created_at)
    columns = [func.count(), *(func.percentile_cont(q).within_group(took) for q in quantiles)]
    row = (
        await session.execute(
            select(*columns)
            .join(first_active, first_active.c.allocation_id == AllocationRow.id)
            .where(first_active.c.at >= since)
        )
    ).one()
    count, values = int(row[0]), row[1:]
    return count, {q: float(v) for q, v in zip(quantiles, values, strict=True) if v is not None}
