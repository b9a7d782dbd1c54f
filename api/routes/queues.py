"""`GET /v1/queues`: the requests waiting for capacity, per region, in admission order.

Each request's position (among every tenant's requests of its region), priority, its tenant's weighted share, how
long it has waited, its deadline, and why it is not placed yet: what the last admission pass recorded (the reason
and its code, the node set aside for it while it is being placed, the node reserved for it as the head). A tenant
token is shown its own requests only, with their positions in the whole queue (api/queue_view.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api import queue_view
from api.auth import Viewer
from api.errors import error_responses
from api.services import Services, services
from contracts.http import QueueList
from contracts.manifest import Name

router = APIRouter(prefix="/v1/queues", tags=["queues"])
App = Annotated[Services, Depends(services)]


@router.get("", response_model=QueueList, responses=error_responses(401, 422))
async def list_queues(
    caller: Viewer,
    app: App,
    region: Annotated[Name | None, Query(description="Only this region's queue.")] = None,
    pool: Annotated[
        str | None,
        Query(
            max_length=507,
            description="`<cluster>/<pool>`: only the requests this pool could serve, at their places in its "
            "region's queue.",
        ),
    ] = None,
) -> QueueList:
    """Every region's queue (regions with waiting requests, or the one asked for), in admission order: priority,
    then the tenant's weighted share, then arrival. A tenant sees its own requests only, placed among everyone's."""
    async with app.sessions() as session:
        return await queue_view.queues(session, app.inventory, caller, region, pool)
