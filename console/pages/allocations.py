"""Allocations: a list with filters, a page per allocation (its states on a timeline from the trail, each attempt,
its bundles and address, who asked for each action, its Temporal UI page) and the actions the visitor's role allows,
each confirmed on a page of its own before it is posted.

What an allocation page shows is what `GET /v1/allocations/{id}` answers this visitor: another tenant's allocation
is a 404 here as it is there. An action is the API's (`release`, `cancel`, `extend`, `retry`), sent with the
visitor's bearer, so the trail names them and the API refuses what their role may not do.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import HTTPException, Path, Query, Request
from fastapi.responses import Response

import berth
from console.web import SignedIn, back, form, page, router
from contracts.allocation import ALLOCATION_STATES, FINAL_STATES, HOLDING_STATES

Id = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
ACTIONS = {
    "release": "Release: its VM is destroyed, its GPUs wiped and given back.",
    "cancel": "Cancel: everything it holds is undone and it ends cancelled.",
    "extend": "Extend: its end moves later.",
    "retry": "Retry: being placed, go on with the next node; failed, place it again.",
}
PAGE_SIZE = 50


def actions_for(visitor: SignedIn, allocation: berth.Allocation) -> list[str]:
    """The buttons to offer: what the visitor's role allows on this allocation in its state. The API decides again
    when one is posted; this only keeps a viewer from being offered what would be refused."""
    if not visitor.member_of(allocation.tenant):
        return []
    offered = []
    if allocation.state in HOLDING_STATES:
        offered += ["release", "extend"]
    if allocation.state not in FINAL_STATES:
        offered.append("cancel")
    if visitor.operator and (allocation.state == "failed" or allocation.state not in FINAL_STATES):
        offered.append("retry")
    return offered


@router.get("/allocations")
async def allocations(
    request: Request,
    visitor: SignedIn,
    state: Annotated[str | None, Query()] = None,
    region: Annotated[str | None, Query()] = None,
    node: Annotated[str | None, Query()] = None,
    tenant: Annotated[str | None, Query()] = None,
    cursor: Annotated[str | None, Query()] = None,
) -> Response:
    chosen = {"state": state or None, "region": region or None, "node": node or None, "tenant": tenant or None}
    try:
        listed = await visitor.api.allocations.page(**chosen, limit=PAGE_SIZE, cursor=cursor or None)
    except berth.InvalidRequest as error:
        listed, problem = None, error.message
    else:
        problem = None
    return page(
        request,
        visitor,
        "allocations.html",
        listed=listed,
        chosen=chosen,
        states=ALLOCATION_STATES,
        problem=problem,
        next_link=_with_cursor(request, listed.next_cursor) if listed and listed.next_cursor else None,
    )


def _with_cursor(request: Request, cursor: str) -> str:
    kept = [(k, v) for k, v in request.query_params.multi_items() if k not in ("cursor", "live")]
    return "/console/allocations?" + "&".join(f"{k}={quote(v)}" for k, v in [*kept, ("cursor", cursor)])


@router.get("/allocations/{allocation_id}")
async def allocation(request: Request, visitor: SignedIn, allocation_id: Id, done: str | None = None) -> Response:
    shown = await _get(visitor, allocation_id)
    return page(
        request,
        visitor,
        "allocation.html",
        allocation=shown,
        actions=actions_for(visitor, shown),
        temporal_ui=_temporal_ui(request, shown.workflow_id),
        done=done,
    )


@router.get("/allocations/{allocation_id}/{action}")
async def confirm(request: Request, visitor: SignedIn, allocation_id: Id, action: str) -> Response:
    """The confirmation an action needs before it is posted (without JavaScript too)."""
    if action not in ACTIONS:
        raise HTTPException(404, f"no action {action!r}")
    shown = await _get(visitor, allocation_id)
    return page(request, visitor, "allocation_confirm.html", allocation=shown, action=action, says=ACTIONS[action])


@router.post("/allocations/{allocation_id}/{action}")
async def act(request: Request, visitor: SignedIn, allocation_id: Id, action: str) -> Response:
    """Carry out a confirmed action through the API, as the visitor; its refusal is shown, never hidden."""
    fields = await form(request, visitor)
    if action not in ACTIONS:
        raise HTTPException(404, f"no action {action!r}")
    allocations = visitor.api.allocations
    try:
        if action == "release":
            await allocations.release(allocation_id)
        elif action == "cancel":
            await allocations.cancel(allocation_id)
        elif action == "retry":
            await allocations.retry(allocation_id)
        else:
            await allocations.extend(allocation_id, by=fields.get("by") or "1h")
    except berth.BerthError as error:
        shown = await _get(visitor, allocation_id)
        return page(
            request,
            visitor,
            "allocation_confirm.html",
            allocation=shown,
            action=action,
            says=ACTIONS[action],
            problem=f"{error.message} ({error.code})",
        )
    return back(f"/console/allocations/{quote(allocation_id)}?done={action}")


async def _get(visitor: SignedIn, allocation_id: str) -> berth.Allocation:
    try:
        return await visitor.api.allocations.get(allocation_id)
    except berth.NotFound as error:
        raise HTTPException(404, error.message) from error


def _temporal_ui(request: Request, workflow_id: str) -> str | None:
    """The workflow's page in the Temporal Web UI, when the API knows the UI's address."""
    base = request.app.state.settings.temporal_ui_url
    if not base:
        return None
    namespace = request.app.state.settings.temporal_namespace
    return f"{base.rstrip('/')}/namespaces/{quote(namespace)}/workflows/{quote(workflow_id, safe='')}"
