"""What a request's CEL selectors may cost the API, and keeping that work off the event loop.

One tenant's selector once held the API's event loop for 15 s (four nested comprehensions through `POST /v1/explain`),
and `/healthz` and every other tenant waited. So, here:

* admission (`api.request_checks.check_selectors`, before anything is created or explained, in a worker thread since
  parsing the longest expressions costs hundreds of milliseconds): the request's selectors together are at most
  `MAX_SELECTOR_TEXT` characters (parsing is linear but slow, about 65 us a token at worst here: a 4 KiB list
  literal took 262 ms, so 2 KiB bounds a request's parsing near a hundred milliseconds; real selectors are tens to
  a few hundred characters), each compiles, and its estimated cost alone is within what a whole request may spend
  (`scheduler.cel.REQUEST_BUDGET`), else 422 `selector_cost_exceeded` naming it (`too_costly`);
* explain (`explain_off_loop`): the scheduling pass runs in a worker thread, charged one CEL budget; past it, 422
  `selector_cost_exceeded` naming the selector it stopped in.

An allocation's own placement charges the same budget in the control worker (activities/control/placement.py),
where it is a refusal with the same code.
"""

from __future__ import annotations

import asyncio

from api.errors import ApiError
from contracts.http import AllocationCreate
from contracts.placement import PlacementRequest, PlacementResult
from scheduler.cel import SelectorCostExceeded
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot

CODE = SelectorCostExceeded.code
MAX_SELECTOR_TEXT = 2048  # characters of a request's selectors together (see above)


def too_long(body: AllocationCreate) -> ApiError | None:
    """422 when the request's selectors are longer together than a request may have parsed, else None."""
    length = sum(len(expression) for expression in body.selectors)
    if length <= MAX_SELECTOR_TEXT:
        return None
    message = (
        f"the request's CEL selectors are {length} characters together; a request may carry at most "
        f"{MAX_SELECTOR_TEXT} (compiling them is part of what a request may spend)"
    )
    return ApiError(422, CODE, message, [{"field": "body.selectors", "characters": length, "limit": MAX_SELECTOR_TEXT}])


def too_costly(body: AllocationCreate, error: SelectorCostExceeded) -> ApiError:
    """422 naming the selector (its index in the request, when it is one of its selectors) and the figures."""
    index = body.selectors.index(error.expression) if error.expression in body.selectors else None
    detail: dict[str, object] = {
        "field": f"body.selectors[{index}]" if index is not None else "body.selectors",
        "expression": error.expression,
        "estimated_cost" if error.estimated else "cost": error.cost,
        "budget": error.budget,
    }
    prefix = f"selectors[{index}]: " if index is not None and error.estimated else ""
    return ApiError(422, CODE, prefix + str(error), [detail])


async def explain_off_loop(
    body: AllocationCreate, snapshot: Snapshot, request: PlacementRequest, detail: bool
) -> PlacementResult:
    """`schedule` in a worker thread, its CEL charged one request budget: 422 `selector_cost_exceeded` past it."""
    try:
        return await asyncio.to_thread(schedule, snapshot, request, detail=detail)
    except SelectorCostExceeded as error:
        raise too_costly(body, error) from None
