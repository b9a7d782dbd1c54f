"""Queues: each region's waiting requests in the order the admission pass takes them, with how long each has
waited, its priority (and class), its tenant, why it is not placed (the pass's words) and what would let it through
(the API's hints: a lease's end, borrowed GPUs, a reservation's end, a node's return).

All of it is `GET /v1/queues` as the visitor's bearer reads it: a tenant sees its own requests at their places in
the whole queue (others' are counted, never named), an operator everyone's.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response

import berth
from console.web import SignedIn, page, router
from contracts.http import RegionQueue


def waited(seconds: float) -> str:
    """90.4 -> "1m30s", 7260 -> "2h1m": as `berth queue` shows it."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m" if hours else f"{minutes}m{secs}s" if minutes else f"{secs}s"


def rows_of(region: RegionQueue) -> list[dict[str, object]]:
    """The region's queue as rows: each visible request, and between them how many of other tenants' requests wait
    (the positions the visitor may not read)."""
    rows: list[dict[str, object]] = []
    last = 0
    for item in region.entries:
        if item.position > last + 1:
            rows.append({"gap": item.position - last - 1, "from": last + 1, "to": item.position - 1})
        rows.append({"item": item})
        last = item.position
    if region.length > last:
        rows.append({"gap": region.length - last, "from": last + 1, "to": region.length})
    return rows


@router.get("/queues")
async def queues(
    request: Request,
    visitor: SignedIn,
    region: Annotated[str | None, Query(max_length=253)] = None,
) -> Response:
    problem = None
    listed = None
    try:
        listed = await visitor.api.queues.get(region=region or None)
    except (berth.InvalidRequest, berth.Forbidden, berth.NotFound) as error:
        problem = error.message
    return page(
        request,
        visitor,
        "queues.html",
        listed=listed,
        region=region or "",
        problem=problem,
        rows_of=rows_of,
        waited=waited,
    )
