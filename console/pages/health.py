"""Health: the GPUs out of placement (failed, degraded or of unknown health, quarantined: each with its node, reason
and since when) and the drains in progress (nodes DRAINING, with how many allocations still hold GPUs there).

Two questions to the API, whatever the fleet's size: `GET /v1/nodes?out_of_placement=true` (only the nodes with such
a GPU) and `GET /v1/nodes?status=DRAINING`. A tenant sees what the API shows it: the nodes of the regions it may use.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response

import berth
from console.pages.fleet import LETTERS, WORDS
from console.web import SignedIn, page, router
from contracts.http import NodeInfo, NodeList

SHOWN = 200  # nodes per list: more than this out of placement at once is an incident its first page already shows


def out_of_placement(nodes: list[NodeInfo]) -> list[dict[str, object]]:
    """One row per GPU out of placement, by node and slot: the unhealthy (reasons, since) and the quarantined."""
    rows = []
    for node in nodes:
        unhealthy = {u.index: u for u in node.unhealthy}
        quarantined = {q.index: q for q in node.quarantined}
        for slot in node.slots:
            sick, held_back = unhealthy.get(slot.index), quarantined.get(slot.index)
            if sick is None and held_back is None:
                continue
            reasons = [*(sick.reasons if sick else []), *([held_back.reason] if held_back and held_back.reason else [])]
            rows.append(
                {
                    "node": node,
                    "slot": slot,
                    "health": sick.health if sick else "healthy",
                    "quarantined": held_back is not None,
                    "reasons": reasons,
                    "since": sick.since if sick else None,
                }
            )
    return rows


@router.get("/health")
async def health(
    request: Request, visitor: SignedIn, region: Annotated[str | None, Query(max_length=63)] = None
) -> Response:
    problem, away, draining = None, NodeList(nodes=[]), NodeList(nodes=[])
    try:
        away = await visitor.api.nodes.page(region=region or None, out_of_placement=True, limit=SHOWN)
        draining = await visitor.api.nodes.page(region=region or None, status="DRAINING", limit=SHOWN)
    except berth.Forbidden as error:
        problem = f"The API does not show you the nodes' health: {error.message}"
    except berth.InvalidRequest as error:
        problem = f"The API refused: {error.message}"
    return page(
        request,
        visitor,
        "health.html",
        region=region or None,
        rows=out_of_placement(away.nodes),
        more_away=away.next_cursor is not None,
        draining=draining.nodes,
        more_draining=draining.next_cursor is not None,
        problem=problem,
        letters=LETTERS,
        words=WORDS,
    )
