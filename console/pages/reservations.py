"""Reservations: a timeline per pool and node, each reservation a bar from its start to its end, labelled with
its tenant, GPUs and state, with a "now" line; and the same reservations in a table.

It is `GET /v1/reservations` as the visitor's bearer reads it: a tenant sees its own tenant's, an operator every
one. The window shown is from a day before now to a week after (or what `from` and `to` ask), and every
reservation's row is in the table whatever the window.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response

import berth
from console import svg
from console.pages.usage import BadInstant, instant
from console.web import SignedIn, page, router
from contracts.http import ReservationView

BEFORE = timedelta(days=1)
AFTER = timedelta(days=7)
NO_POOL = "(no pool now)"


def lanes_of(reservations: list[ReservationView]) -> list[tuple[str, list[svg.Lane]]]:
    """(pool, a lane per node of it) for every pool a reservation's node is in, pools and nodes by name."""
    by_pool: dict[str, dict[str, list[svg.Span]]] = defaultdict(lambda: defaultdict(list))
    for r in reservations:
        span = svg.Span(
            r.starts_at, r.ends_at, f"{r.tenant} {r.gpu_count} GPU{'s' if r.gpu_count != 1 else ''}", r.state
        )
        for pool in r.pools or [NO_POOL]:
            by_pool[pool][r.node].append(span)
    return [
        (pool, [svg.Lane(node, spans) for node, spans in sorted(nodes.items())])
        for pool, nodes in sorted(by_pool.items())
    ]


@router.get("/reservations")
async def reservations(
    request: Request,
    visitor: SignedIn,
    start: Annotated[str | None, Query(alias="from", max_length=64)] = None,
    end: Annotated[str | None, Query(alias="to", max_length=64)] = None,
) -> Response:
    now = datetime.now(UTC)
    problem = None
    listed: list[ReservationView] = []
    try:
        since = instant(start, "From") or now - BEFORE
        until = instant(end, "To") or max(since, now) + AFTER
        if since >= until:
            raise BadInstant(f"From ({since:%Y-%m-%d %H:%M}Z) is not before To ({until:%Y-%m-%d %H:%M}Z)")
        listed = [r async for r in visitor.api.reservations.list()]
    except BadInstant as error:
        since, until, problem = now - BEFORE, now + AFTER, str(error)
    except (berth.InvalidRequest, berth.Forbidden) as error:
        since, until, problem = now - BEFORE, now + AFTER, error.message
    charts = [
        (
            pool,
            svg.timeline(
                f"timeline-{index}",
                f"Reservations in pool {pool}",
                f"A row per node of {pool}; each reservation a bar from its start to its end, labelled with its "
                f"tenant, GPUs and state; the dashed line is now. Every reservation is in the table below.",
                lanes,
                since,
                until,
                now,
            ),
        )
        for index, (pool, lanes) in enumerate(lanes_of(listed))
    ]
    return page(
        request,
        visitor,
        "reservations.html",
        listed=listed,
        charts=charts,
        chosen={"from": start or "", "to": end or ""},
        window=(since, until),
        now=now,
        states=list(svg.STATE_STYLE),
        problem=problem,
    )
