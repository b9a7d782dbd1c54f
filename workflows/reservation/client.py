"""Starting a reservation's workflow: what the API calls once a window is admitted and its row written,
and what the benchmark and the chaos test call for theirs.

The workflow's request is the reservation's, pinned to the node it was admitted on and carrying the reservation's
id (placement then applies every other reservation's hold but its own) and the window's length as its lease.
"""

from __future__ import annotations

from datetime import datetime

from temporalio.client import Client

from contracts.placement import PlacementRequest
from contracts.task_queues import Queues
from workflows.allocation.messages import Timing
from workflows.reservation.workflow import ReservationInput, ReservationWorkflow


def workflow_id(reservation_id: str) -> str:
    return f"reservation/{reservation_id}"


async def start_reservation(
    client: Client,
    reservation_id: str,
    tenant: str,
    node: str,
    request: PlacementRequest,
    starts_at: datetime,
    ends_at: datetime,
    timing: Timing,
    queues: Queues,
    actor: str | None = None,
) -> None:
    """Start `reservation/<id>`: `reserved` until `starts_at`, then its allocation on `node` until `ends_at`."""
    pinned = request.model_copy(
        update={
            "nodes": frozenset({node}),
            "reservation_id": reservation_id,
            "lease_seconds": ends_at.timestamp() - starts_at.timestamp(),
        }
    )
    start = ReservationInput(
        reservation_id=reservation_id,
        tenant=tenant,
        request=pinned,
        starts_at=starts_at,
        ends_at=ends_at,
        timing=timing,
        queues=queues,
        actor=actor,
    )
    await client.start_workflow(
        ReservationWorkflow.run, start, id=workflow_id(reservation_id), task_queue=queues.control
    )
