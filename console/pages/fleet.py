"""The fleet: regions, then pools, each pool's GPUs counted by state and drawn as one stacked bar, then a pool's
nodes a page at a time, each GPU a cell.

The top page aggregates: one `GET /v1/capacity` answers every pool's GPUs by state (`PoolCapacity.states`, counted
by the API from its snapshot), so a fleet of 10,000 nodes is one call and a few hundred lines of HTML. A pool's page
lists its nodes through `GET /v1/nodes?pool=cluster/pool`, PAGE_SIZE at a time, each GPU with its state and, where
the API names it to this visitor, the allocation holding it (another tenant's work is only "in use").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import quote

from fastapi import HTTPException, Path, Query, Request
from fastapi.responses import Response

import berth
from console.web import SignedIn, page, router
from contracts.placement import GPU_STATES, PoolCapacity

PAGE_SIZE = 100  # nodes per pool page: 800 GPU cells
Segment = Annotated[str, Path(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]

# Each state's letter (on every cell, so no state is told by colour alone) and its words (titles, legend).
LETTERS = {
    "free": "F",
    "held": "H",
    "reserved": "R",
    "leased": "L",
    "quarantined": "Q",
    "failed": "X",
    "degraded": "D",
    "off": "O",
}
WORDS = {
    "free": "free",
    "held": "held by an allocation",
    "reserved": "reserved for a reservation whose window is open",
    "leased": "leased: an allocation is being placed on it",
    "quarantined": "quarantined until a wipe is confirmed",
    "failed": "failed: unhealthy until repaired",
    "degraded": "degraded or of unknown health: no new work",
    "off": "off: its node is cordoned, draining, down or without a live agent, or it did not validate",
}


@dataclass
class Tally:
    """GPUs by state over some pools: a region's, or the whole fleet's."""

    name: str
    gpus: int = 0
    nodes: int = 0
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GPU_STATES, 0))
    pools: list[PoolCapacity] = field(default_factory=list)

    def add(self, pool: PoolCapacity) -> None:
        self.gpus += pool.gpus
        self.nodes += pool.nodes
        for state, count in pool.states.items():
            self.states[state] = self.states.get(state, 0) + count
        self.pools.append(pool)


def bar(states: dict[str, int], gpus: int, width: int = 400) -> list[tuple[str, float, float, int]]:
    """A stacked bar's segments: (state, x, width, count), in the legend's order, none for a state of no GPU."""
    segments, x = [], 0.0
    for state in GPU_STATES:
        count = states.get(state, 0)
        if count and gpus:
            w = width * count / gpus
            segments.append((state, round(x, 2), round(w, 2), count))
            x += w
    return segments


def _counts(pools: list[PoolCapacity], key: str) -> list[tuple[str, int]]:
    found: dict[str, int] = {}
    for pool in pools:
        name = getattr(pool, key) or "none"
        found[name] = found.get(name, 0) + pool.gpus
    return sorted(found.items())


@router.get("/fleet")
async def fleet(
    request: Request,
    visitor: SignedIn,
    product: Annotated[str | None, Query(max_length=64)] = None,
    region: Annotated[str | None, Query(max_length=63)] = None,
) -> Response:
    chosen = {"product": product or None, "region": region or None}
    problem, pools = None, []
    try:
        pools = (await visitor.api.capacity.now()).pools
    except berth.Forbidden as error:
        problem = f"The API does not show you the fleet: {error.message}"
    except berth.BerthError as error:
        problem = f"The API did not answer the fleet's capacity: {error.message} ({error.code})"
    products, regions = _counts(pools, "gpu_product"), _counts(pools, "region")
    shown = [
        p
        for p in pools
        if (chosen["region"] is None or p.region == chosen["region"])
        and (chosen["product"] is None or (p.gpu_product or "none").casefold() == chosen["product"].casefold())
    ]
    total, by_region = Tally("fleet"), {}
    for pool in shown:
        total.add(pool)
        by_region.setdefault(pool.region, Tally(pool.region)).add(pool)
    return page(
        request,
        visitor,
        "fleet.html",
        chosen=chosen,
        products=products,
        regions=regions,
        total=total,
        by_region=[by_region[name] for name in sorted(by_region)],
        problem=problem,
        bar=bar,
        letters=LETTERS,
        words=WORDS,
        states=GPU_STATES,
    )


@router.get("/fleet/pools/{cluster}/{pool}")
async def pool_page(
    request: Request,
    visitor: SignedIn,
    cluster: Segment,
    pool: Segment,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    key = f"{cluster}/{pool}"
    problem, summary, listed = None, None, None
    try:
        summary = next((p for p in (await visitor.api.capacity.now()).pools if p.pool == key), None)
        if summary is None:
            raise HTTPException(404, f"no pool {key} that you may see")
        listed = await visitor.api.nodes.page(pool=key, limit=PAGE_SIZE, cursor=cursor or None)
    except berth.Forbidden as error:
        problem = f"The API does not show you this pool's nodes: {error.message}"
    except berth.InvalidRequest as error:
        problem = f"The API refused the page: {error.message}"
    return page(
        request,
        visitor,
        "fleet_pool.html",
        key=key,
        summary=summary,
        listed=listed,
        problem=problem,
        first_page=cursor is None,
        next_link=f"/console/fleet/pools/{cluster}/{pool}?cursor={quote(listed.next_cursor)}"
        if listed and listed.next_cursor
        else None,
        bar=bar,
        letters=LETTERS,
        words=WORDS,
        states=GPU_STATES,
    )
