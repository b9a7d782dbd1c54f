"""Control-side reservation steps: a reservation's start and its end, recorded in PostgreSQL.

start_reservation    `started`, its allocation's id and row recorded (so its hold lasts until that allocation
                     claims the GPUs, and a read finds the allocation at once), and the preemptible allocations on its
                     node that must leave for it: the newest first, as few as give it room
finish_reservation   ended, cancelled or failed, with the reason
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from contracts.allocation import AllocationRecord, ReservationRef, ReservationStart
from contracts.placement import CapacityShape, PlacementRequest
from store import queue, reservations, trail
from store.db import AsyncSession, async_sessionmaker


class ReservationActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    @activity.defn(name="start_reservation")
    async def start_reservation(self, reservation: ReservationRef) -> ReservationStart:
        async with self.sessions.begin() as session:
            row = await reservations.get(session, reservation.reservation_id)
            if row is None:
                raise ApplicationError(f"reservation {reservation.reservation_id} does not exist", non_retryable=True)
            allocation_id = row.allocation_id or f"{row.id}-a"
            await reservations.mark(session, row.id, "started", allocation_id=allocation_id)
            # The allocation's row now, as the API writes a create's: `started` names an allocation a read can find.
            request = PlacementRequest(
                gpu_count=row.gpu_count, gpu_product=row.gpu_product, shape=CapacityShape(row.shape), tenant=row.tenant
            )
            opening = AllocationRecord(
                allocation_id=allocation_id,
                tenant=row.tenant,
                request=request,
                workflow_id=f"allocation/{allocation_id}",
                request_body={"reservation": row.id},
            )
            await trail.open_row(session, opening)
            victims: list[tuple[str, float]] = []
            room = await reservations.free_slots(session, row.node_id)
            on_node = [a for a in await queue.active_allocations(session, row.region) if a.running.node == row.node_id]
            for active in sorted(on_node, key=lambda a: a.running.started, reverse=True):  # the newest first
                if room >= row.gpu_count:
                    break
                if active.running.preemptible:
                    victims.append((active.running.allocation_id, active.grace_seconds))
                    room += active.running.gpus
        return ReservationStart(allocation_id=allocation_id, victims=victims)

    @activity.defn(name="finish_reservation")
    async def finish_reservation(self, reservation: ReservationRef) -> None:
        async with self.sessions.begin() as session:
            await reservations.mark(session, reservation.reservation_id, reservation.state, reason=reservation.reason)

    def activities(self) -> list[object]:
        return [self.start_reservation, self.finish_reservation]
