"""What the API reads of the GPU hosts for operators (`nodes` with their pool, region, agent and slot counts; the
slots that do not validate or are quarantined), and the one thing it writes: a node's operator status (cordon).

Slot counts are one grouped subquery joined to the nodes, so a page of nodes costs one statement whatever the size
of the fleet, plus one for the page's slots that need an operator.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.db import among
from store.models import AllocationRow, ClaimRow, ClusterRow, NodeAgentRow, NodeRow, PoolRow, SlotRow

# A node with its pool, its cluster's region, its agent (None: never reported), and its slots counted: all, available,
# reserved, quarantined, validated (`valid` or `raw_only`) and compatible (`valid`); a count is None for no slots.
NodeSummary = Row[tuple[Any, ...]]


def _nodes() -> Select[tuple[Any, ...]]:
    slots = (
        select(
            SlotRow.node_id,
            func.count().label("gpus"),
            func.count().filter(SlotRow.state == "available").label("available"),
            func.count().filter(SlotRow.state == "reserved").label("reserved"),
            func.count().filter(SlotRow.state == "quarantined").label("quarantined"),
            func.count().filter(SlotRow.validation.in_(("valid", "raw_only"))).label("validated"),
            func.count().filter(SlotRow.validation == "valid").label("compatible"),
        )
        .group_by(SlotRow.node_id)
        .subquery()
    )
    return (
        select(NodeRow, PoolRow, ClusterRow.region, NodeAgentRow, *slots.c[1:])
        .join(PoolRow, PoolRow.id == NodeRow.pool_id)
        .join(ClusterRow, ClusterRow.name == PoolRow.cluster)
        .outerjoin(NodeAgentRow, NodeAgentRow.node == NodeRow.name)
        .outerjoin(slots, slots.c.node_id == NodeRow.name)
        .order_by(NodeRow.name)
    )


async def node_summary(session: AsyncSession, name: str) -> NodeSummary | None:
    """One node's summary; None for a node the fleet does not have."""
    return (await session.execute(_nodes().where(NodeRow.name == name))).first()


async def node_page(
    session: AsyncSession,
    *,
    region: str | None = None,
    status: str | None = None,
    pool: tuple[str, str] | None = None,
    regions: frozenset[str] | None = None,
    out_of_placement: bool = False,
    after: str | None = None,
    limit: int,
) -> Sequence[NodeSummary]:
    """Up to `limit` node summaries by name, of the region, status and pool (cluster, name) when given, of `regions`
    only when given (what a tenant may use), after the name `after` (a keyset page). `status` is what the node is
    doing, as the API shows it: `READY` needs a live agent too, `NOT_READY` is READY without one (never reported, or
    stopped); the others are the node's own status. `out_of_placement`: only nodes with a GPU that is not healthy
    or is quarantined."""
    query = _nodes()
    if region is not None:
        query = query.where(ClusterRow.region == region)
    if regions is not None:
        query = query.where(among(ClusterRow.region, sorted(regions)))
    if pool is not None:
        query = query.where(PoolRow.cluster == pool[0], PoolRow.name == pool[1])
    if out_of_placement:
        away = select(SlotRow.id).where(
            SlotRow.node_id == NodeRow.name, or_(SlotRow.health != "healthy", SlotRow.state == "quarantined")
        )
        query = query.where(away.exists())
    live = NodeAgentRow.state == "live"  # NULL for a node whose agent never reported
    if status == "READY":
        query = query.where(NodeRow.status == "READY", live)
    elif status == "NOT_READY":
        query = query.where(NodeRow.status == "READY", or_(NodeAgentRow.node.is_(None), ~live))
    elif status is not None:
        query = query.where(NodeRow.status == status)
    if after is not None:
        query = query.where(NodeRow.name > after)
    return (await session.execute(query.limit(limit))).all()


async def unvalidated_slots(session: AsyncSession, nodes: list[str] | None = None) -> list[SlotRow]:
    """Every slot (of `nodes`, when given) whose validation is not `valid`, by node and index: what an operator has
    to fix."""
    query = select(SlotRow).where(SlotRow.validation != "valid").order_by(SlotRow.node_id, SlotRow.slot_index)
    if nodes is not None:
        query = query.where(among(SlotRow.node_id, nodes))
    return list((await session.scalars(query)).all())


async def quarantined_slots(session: AsyncSession, nodes: list[str] | None = None) -> list[tuple[str, int, str | None]]:
    """(node, slot index, quarantine reason) of every quarantined slot (of `nodes`, when given), by node and index."""
    query = select(SlotRow.node_id, SlotRow.slot_index, SlotRow.quarantine_reason).where(SlotRow.state == "quarantined")
    if nodes is not None:
        query = query.where(among(SlotRow.node_id, nodes))
    rows = await session.execute(query.order_by(SlotRow.node_id, SlotRow.slot_index))
    return [(node, index, reason) for node, index, reason in rows.all()]


# The kind of a health reason, for a metric label of few values (scheduler/host/health.py writes the reasons).
_REASON_KINDS = (
    ("AER", "aer"),
    ("link trained", "link"),
    ("gone from the PCI bus", "gone"),
    ("Xid", "xid"),
    ("NVMe", "nvme"),
    ("function-level reset", "reset"),
    ("could not be read", "unreadable"),
)


def reason_kind(reason: str | None) -> str:
    if reason is None:
        return "none"
    return next((kind for needle, kind in _REASON_KINDS if needle in reason), "other")


async def slot_health(session: AsyncSession) -> list[tuple[str, str, str, int]]:
    """(pool `cluster/name`, health, reason kind, approved slots) over the fleet."""
    rows = await session.execute(
        select(PoolRow.cluster, PoolRow.name, SlotRow.health, SlotRow.health_reason, func.count())
        .join(NodeRow, NodeRow.name == SlotRow.node_id)
        .join(PoolRow, PoolRow.id == NodeRow.pool_id)
        .where(SlotRow.approved.is_(True))
        .group_by(PoolRow.cluster, PoolRow.name, SlotRow.health, SlotRow.health_reason)
    )
    counted: dict[tuple[str, str, str], int] = {}
    for cluster, name, health, reason, count in rows:
        key = (f"{cluster}/{name}", health, reason_kind(reason))
        counted[key] = counted.get(key, 0) + int(count)
    return [(*key, count) for key, count in sorted(counted.items())]


async def node_slots(session: AsyncSession, node: str) -> list[SlotRow]:
    """Every slot of the node, by index."""
    return list(
        (await session.scalars(select(SlotRow).where(SlotRow.node_id == node).order_by(SlotRow.slot_index))).all()
    )


async def unhealthy_slots(session: AsyncSession, nodes: list[str] | None = None) -> list[SlotRow]:
    """Every slot (of `nodes`, when given) whose health is not `healthy`, by node and index."""
    query = select(SlotRow).where(SlotRow.health != "healthy").order_by(SlotRow.node_id, SlotRow.slot_index)
    if nodes is not None:
        query = query.where(among(SlotRow.node_id, nodes))
    return list((await session.scalars(query)).all())


async def repair_slots(
    session: AsyncSession, node: str, indexes: list[int], now: datetime
) -> list[tuple[int, str, str | None]]:
    """An operator repaired these slots: each is healthy again until its agent judges otherwise, and its
    agent is asked for its verdicts again (`repaired_at`). Returns (index, health before, its reason) per slot;
    raises LookupError naming an index the node does not have."""
    rows = {
        row.slot_index: row
        for row in (
            await session.scalars(
                select(SlotRow).where(SlotRow.node_id == node, SlotRow.slot_index.in_(indexes)).with_for_update()
            )
        ).all()
    }
    missing = sorted(set(indexes) - set(rows))
    if missing:
        raise LookupError(", ".join(map(str, missing)))
    repaired = []
    for index in sorted(set(indexes)):
        row = rows[index]
        repaired.append((index, row.health, row.health_reason))
        row.health, row.health_reason, row.health_reasons = "healthy", None, []
        row.health_at, row.repaired_at = now, now
    # Void the approval every API process confirmed for this node's agent: each that answers its steady reports from
    # memory reads the approval back at its next flush and forgets the node (api/heartbeats.py), so the agent's next
    # report goes the full way, wherever it lands, is asked for its verdicts, and has the approval written again.
    await session.execute(update(NodeAgentRow).where(NodeAgentRow.node == node).values(approved=None))
    await session.flush()
    return repaired


async def holders(session: AsyncSession, node: str) -> list[str]:
    """The allocations holding slots of `node` (active claims), by id."""
    rows = await session.scalars(
        select(ClaimRow.allocation_id).where(ClaimRow.node_id == node, ClaimRow.released_at.is_(None)).distinct()
    )
    return sorted(rows.all())


async def locked_node(session: AsyncSession, name: str) -> NodeRow | None:
    """The node's row, locked until the transaction ends, so that two operators' status changes serialise."""
    return await session.get(NodeRow, name, with_for_update=True)


async def set_status(session: AsyncSession, node: NodeRow, status: str) -> None:
    """Set a node's operator status (a node that `locked_node` returned); a fleet re-apply keeps it."""
    node.status = status
    await session.flush()


async def allocation_tenants(session: AsyncSession, allocations: Collection[str]) -> dict[str, str]:
    """The tenant of each of these allocations, by id."""
    if not allocations:
        return {}
    rows = await session.execute(
        select(AllocationRow.id, AllocationRow.tenant).where(among(AllocationRow.id, sorted(allocations)))
    )
    return {ident: tenant for ident, tenant in rows.all()}
