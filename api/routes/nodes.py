"""`/v1/nodes` (admin): the GPU hosts, their agents and slot validation, cordoning; and the agents' reports.

A cordoned node takes no new allocations (the scheduler only places on READY nodes) and keeps the ones it has.
The cordon survives re-applying an unchanged fleet file; uncordon makes the node READY again.

`POST /v1/nodes/{node}/report` is the node agents' route: a node token may report only for its own node (anything
else is refused and logged); see `api/heartbeats.py` for why most reports cost no database write.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path
from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import Admin, Reporter
from api.errors import ApiError, conflict, error_responses, not_found
from api.models import NodeInfo, NodeList
from api.services import Services, services
from fleet.meta import Name
from fleet.node import NodeStatus
from scheduler.host.report import NodeReport, ReportReply
from store.models import ClusterRow, NodeRow, PoolRow, SlotRow
from store.node_reports import TopologyMismatch, record_report

log = logging.getLogger("berth.api")

router = APIRouter(prefix="/v1/nodes", tags=["admin"])
App = Annotated[Services, Depends(services)]
NodePath = Annotated[Name, Path(description="The node's name.")]


def _nodes() -> Select:
    slots = (
        select(
            SlotRow.node_id,
            func.count().label("gpus"),
            func.count().filter(SlotRow.state == "available").label("available"),
            func.count().filter(SlotRow.state == "reserved").label("reserved"),
            func.count().filter(SlotRow.state == "quarantined").label("quarantined"),
        )
        .group_by(SlotRow.node_id)
        .subquery()
    )
    return (
        select(
            NodeRow, PoolRow, ClusterRow.region, slots.c.gpus, slots.c.available, slots.c.reserved, slots.c.quarantined
        )
        .join(PoolRow, PoolRow.id == NodeRow.pool_id)
        .join(ClusterRow, ClusterRow.name == PoolRow.cluster)
        .outerjoin(slots, slots.c.node_id == NodeRow.name)
        .order_by(NodeRow.name)
    )


def _info(node: NodeRow, pool: PoolRow, region: str | None, *counts: int | None) -> NodeInfo:
    gpus, available, reserved, quarantined = (count or 0 for count in counts)
    return NodeInfo(
        name=node.name,
        cluster=pool.cluster,
        pool=f"{pool.cluster}/{pool.name}",
        region=region,
        shape=pool.shape,
        gpu_product=pool.gpu_product,
        status=node.status,
        declared_status=node.declared_status,
        gpus=gpus,
        available_slots=available,
        reserved_slots=reserved,
        quarantined_slots=quarantined,
        labels=dict(node.labels),
    )


async def _one(session: AsyncSession, name: str) -> NodeInfo:
    row = (await session.execute(_nodes().where(NodeRow.name == name))).first()
    if row is None:
        raise not_found("node", name)
    return _info(*row)


@router.get("", response_model=NodeList, responses=error_responses(401, 403, 422))
async def list_nodes(caller: Admin, app: App, region: Name | None = None, status: NodeStatus | None = None) -> NodeList:
    """Every node with its pool, status and slot usage."""
    query = _nodes()
    if region is not None:
        query = query.where(ClusterRow.region == region)
    if status is not None:
        query = query.where(NodeRow.status == status.value)
    async with app.sessions() as session:
        return NodeList(nodes=[_info(*row) for row in (await session.execute(query)).all()])


async def _set_status(app: Services, name: str, wanted: str) -> NodeInfo:
    async with app.sessions.begin() as session:
        node = await session.get(NodeRow, name, with_for_update=True)
        if node is None:
            raise not_found("node", name)
        if node.status in (NodeStatus.DOWN.value, NodeStatus.DRAINING.value):
            raise conflict(f"node {name} is {node.status}; only a READY or CORDONED node can be (un)cordoned")
        node.status = wanted
        await session.flush()
        return await _one(session, name)


@router.post("/{node}/cordon", response_model=NodeInfo, responses=error_responses(401, 403, 404, 409, 422))
async def cordon(node: NodePath, caller: Admin, app: App) -> NodeInfo:
    """Stop placing new allocations on the node. Cordoning a cordoned node changes nothing."""
    return await _set_status(app, node, NodeStatus.CORDONED.value)


@router.post("/{node}/uncordon", response_model=NodeInfo, responses=error_responses(401, 403, 404, 409, 422))
async def uncordon(node: NodePath, caller: Admin, app: App) -> NodeInfo:
    """Let the node take allocations again. Uncordoning a READY node changes nothing."""
    return await _set_status(app, node, NodeStatus.READY.value)


@router.post(
    "/{node}/report",
    response_model=ReportReply,
    response_model_exclude_none=True,
    responses=error_responses(401, 403, 404, 422),
    tags=["agents"],
)
async def report(node: NodePath, body: NodeReport, caller: Reporter, app: App) -> ReportReply:
    """A node agent's report: on start, when its host changes, and every interval. Answers with the node's approved
    slots when the agent's copy is out of date, and asks for the whole host when the control plane lacks it."""
    if caller.role == "node" and caller.node != node:
        log.warning("refused a report for node %s made with the token of node %s", node, caller.node)
        raise ApiError(403, "forbidden", f"a token of node {caller.node!r} cannot report for node {node!r}")
    now = datetime.now(UTC)
    if app.heartbeats.steady(node, body):
        app.heartbeats.add(node, now, body.agent.interval_seconds)
        await app.heartbeats.maybe_flush(app.sessions)
        return ReportReply(node=node, live=True, approved=body.approved or "")
    async with app.sessions.begin() as session:
        try:
            reply = await record_report(session, node, body, now)
        except LookupError:
            raise not_found("node", node) from None
        except TopologyMismatch as mismatch:
            raise ApiError(422, "topology_mismatch", str(mismatch)) from None
    if not reply.send_host:
        app.heartbeats.confirm(node, body.topology, reply.approved)
    await app.heartbeats.maybe_flush(app.sessions)
    return reply
