"""Reservations: GPUs promised to a tenant on one node for a future window, and what holds a node's GPUs
over time (running allocations and their ends, other reservations), as `scheduler.admission.reservations` reads them.

    API create --region lock--> window_facts -> scheduler.admission.reservations.admit -> create (state reserved)
    placement  --holds--> the GPUs of reservations not yet held by their allocation (scheduler.admission.reservations.with_holds)
    ReservationWorkflow --start / finish--> started (its allocation asked for) -> ended | cancelled | failed
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from scheduler.admission.reservations import Holding, Reserved, Window
from store.models import AllocationRow, ReservationRow, SlotRow
from store.queue import class_facts
from store.snapshot import HELD_STATES

OPEN_STATES = ("reserved", "started")


# A window that has ended holds nothing, even if its row was never closed (its workflow terminated, say). A plain
# statement: every placement decision reads it, and there is usually nothing to find.
_HOLDS = text(
    "SELECT r.id, r.node_id, r.gpu_count, r.starts_at, r.ends_at FROM reservations AS r "
    "WHERE r.ends_at > now() AND (r.state = 'reserved' OR (NOT :only_reserved AND r.state = 'started' AND NOT EXISTS "
    "(SELECT 1 FROM allocation_resource_claims AS c WHERE c.allocation_id = r.allocation_id AND c.released_at IS NULL)))"
)


async def holds(session: AsyncSession, *, only_reserved: bool = False) -> list[Reserved]:
    """The reservations whose GPUs are still held for them: not started yet, or started but their allocation holds
    no claim yet (`only_reserved`: the first kind alone, for queued requests), and whose window has not ended."""
    rows = await session.execute(_HOLDS, {"only_reserved": only_reserved})
    return [
        Reserved(ident, node, gpus, Window(starts.timestamp(), ends.timestamp()))
        for ident, node, gpus, starts, ends in rows
    ]


async def free_slots(session: AsyncSession, node: str) -> int:
    """How many of the node's slots are available now: the room a starting reservation has on it before it asks
    preemptible allocations to leave."""
    count = await session.scalar(select(func.count()).where(SlotRow.node_id == node, SlotRow.state == "available"))
    return int(count or 0)


async def window_facts(session: AsyncSession, region: str) -> tuple[list[Holding], list[Reserved]]:
    """What holds the region's nodes over time: its running allocations (with their ends, preemptible or not), and
    its open reservations not yet held by their allocation (one that is, is among the running allocations)."""
    classes = await class_facts(session)
    rows = await session.execute(
        select(
            AllocationRow.id,
            AllocationRow.node_id,
            AllocationRow.gpu_count,
            AllocationRow.ends_at,
            AllocationRow.request["priority_class"].astext,
        ).where(
            AllocationRow.region == region, AllocationRow.state.in_(HELD_STATES), AllocationRow.node_id.is_not(None)
        )
    )
    holdings = []
    for allocation_id, node, gpus, ends_at, named in rows:
        preemptible = classes.preemptible(named)
        until = ends_at.timestamp() if ends_at is not None else None
        holdings.append(Holding(allocation_id, node, int(gpus), until, preemptible))
    mine = set(await _in_region(session, region))
    return holdings, [r for r in await holds(session) if r.reservation_id in mine]


async def close_open(session: AsyncSession, reservation_id: str, state: str, reason: str) -> None:
    """Close a reservation that is still open (a closed one is left as it is)."""
    await session.execute(
        update(ReservationRow)
        .where(ReservationRow.id == reservation_id, ReservationRow.state.in_(OPEN_STATES))
        .values(state=state, reason=reason)
    )


async def open_rows(session: AsyncSession) -> Sequence[ReservationRow]:
    """Every reservation still `reserved` or `started`: its workflow should be running."""
    return (await session.scalars(select(ReservationRow).where(ReservationRow.state.in_(OPEN_STATES)))).all()


async def _in_region(session: AsyncSession, region: str) -> Sequence[str]:
    rows = await session.scalars(
        select(ReservationRow.id).where(ReservationRow.region == region, ReservationRow.state.in_(OPEN_STATES))
    )
    return rows.all()


async def create(session: AsyncSession, row: ReservationRow) -> None:
    session.add(row)
    await session.flush()


async def get(session: AsyncSession, reservation_id: str) -> ReservationRow | None:
    return await session.get(ReservationRow, reservation_id)


async def listed(session: AsyncSession, tenants: frozenset[str] | None) -> list[ReservationRow]:
    """Reservations of `tenants` (None: every tenant's), soonest first."""
    query = select(ReservationRow).order_by(ReservationRow.starts_at, ReservationRow.id)
    if tenants is not None:
        query = query.where(ReservationRow.tenant.in_(sorted(tenants)))
    return list((await session.scalars(query)).all())


async def mark(
    session: AsyncSession,
    reservation_id: str,
    state: str,
    *,
    allocation_id: str | None = None,
    reason: str | None = None,
) -> None:
    values: dict[str, object] = {"state": state}
    if allocation_id is not None:
        values["allocation_id"] = allocation_id
    if reason is not None:
        values["reason"] = reason
    await session.execute(update(ReservationRow).where(ReservationRow.id == reservation_id).values(**values))
