"""A node: its GPUs with their states, health verdicts and signals (the driver's advice among them), the allocations
on it, its agent's liveness, and for operators cordon, drain and uncordon, each confirmed on a page of its own.

What the page shows is what `GET /v1/nodes/{node}` answers this visitor (a tenant: a node of a region it may use,
only its own allocations named); an action is the API's, posted with the visitor's bearer, and a refusal is shown.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException, Path, Request
from fastapi.responses import Response

import berth
from console.pages.fleet import LETTERS, WORDS
from console.web import SignedIn, Visitor, back, form, page, router
from contracts.http import NodeInfo
from contracts.placement import GPU_STATES

Node = Annotated[str, Path(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)]
ACTIONS = {
    "cordon": "Cordon: nothing new is placed on it; what runs there stays.",
    "drain": "Drain: nothing new is placed on it, and each allocation's owner is told to move; nothing is torn down.",
    "uncordon": "Uncordon: it takes new allocations again, cordoned or drained.",
}
ALLOCATIONS_SHOWN = 50


def actions_for(visitor: Visitor, node: NodeInfo) -> list[str]:
    """The buttons to offer an operator for the node's status; the API decides again when one is posted."""
    if not visitor.operator or node.status == "DOWN":
        return []
    offered = []
    if node.status not in ("CORDONED", "DRAINING"):
        offered.append("cordon")
    if node.status != "DRAINING":
        offered.append("drain")
    if node.status in ("CORDONED", "DRAINING"):
        offered.append("uncordon")
    return offered


async def _get(visitor: Visitor, name: str) -> NodeInfo:
    try:
        return await visitor.api.nodes.get(name)
    except berth.NotFound as error:
        raise HTTPException(404, error.message) from error


def _gpus(node: NodeInfo) -> list[dict[str, object]]:
    """Per GPU, everything the API says of it: state, holder, health and reasons, validation, quarantine, signals."""
    unhealthy = {u.index: u for u in node.unhealthy}
    invalid = {v.index: v for v in node.invalid_slots}
    quarantined = {q.index: q for q in node.quarantined}
    signals = {s.index: s for s in node.signals}
    return [
        {
            "slot": slot,
            "unhealthy": unhealthy.get(slot.index),
            "invalid": invalid.get(slot.index),
            "quarantined": quarantined.get(slot.index),
            "signals": signals.get(slot.index),
        }
        for slot in node.slots
    ]


@router.get("/nodes/{name}")
async def node_page(request: Request, visitor: SignedIn, name: Node, done: str | None = None) -> Response:
    problem, node, allocations = None, None, None
    try:
        node = await _get(visitor, name)
        allocations = await visitor.api.allocations.page(node=name, limit=ALLOCATIONS_SHOWN)
    except berth.Forbidden as error:
        problem = f"The API does not show you this node: {error.message}"
    except berth.InvalidRequest as error:
        problem = f"The API refused: {error.message}"
    return page(
        request,
        visitor,
        "node.html",
        name=name,
        node=node,
        gpus=_gpus(node) if node else [],
        allocations=allocations,
        actions=actions_for(visitor, node) if node else [],
        problem=problem,
        done=done if done in ACTIONS else None,
        letters=LETTERS,
        words=WORDS,
        states=GPU_STATES,
    )


async def _confirm_page(request: Request, visitor: Visitor, name: str, action: str, problem: str | None) -> Response:
    """The confirmation page, with the API's refusal when there was one (a node this visitor may not read: none)."""
    try:
        node: NodeInfo | None = await _get(visitor, name)
    except berth.Forbidden as error:
        node, problem = None, problem or f"{error.message} ({error.code})"
    says = ACTIONS[action]
    return page(request, visitor, "node_confirm.html", name=name, node=node, action=action, says=says, problem=problem)


@router.get("/nodes/{name}/{action}")
async def confirm(request: Request, visitor: SignedIn, name: Node, action: str) -> Response:
    """The confirmation an action needs before it is posted (without JavaScript too)."""
    if action not in ACTIONS:
        raise HTTPException(404, f"no action {action!r}")
    return await _confirm_page(request, visitor, name, action, None)


@router.post("/nodes/{name}/{action}")
async def act(request: Request, visitor: SignedIn, name: Node, action: str) -> Response:
    """Carry out a confirmed action through the API, as the visitor; its refusal is shown, never hidden."""
    await form(request, visitor)
    if action not in ACTIONS:
        raise HTTPException(404, f"no action {action!r}")
    nodes = visitor.api.nodes
    try:
        if action == "cordon":
            await nodes.cordon(name)
        elif action == "drain":
            await nodes.drain(name)
        else:
            await nodes.uncordon(name)
    except berth.BerthError as error:
        return await _confirm_page(request, visitor, name, action, f"{error.message} ({error.code})")
    return back(f"/console/nodes/{name}?done={action}")
