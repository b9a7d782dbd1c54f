"""`/v1/nodes` (admin): the GPU hosts, their slot usage, and cordoning.

A cordoned node takes no new allocations (the scheduler only places on READY nodes) and keeps the ones it has.
The cordon survives re-applying an unchanged fleet file; uncordon makes the node READY again.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import Admin
from api.errors import conflict, error_responses, not_found
from api.models import NodeInfo, NodeList
from api.services import Services, services
from fleet.meta import Name
from fleet.node import NodeStatus
from store.models import ClusterRow, NodeRow, PoolRow, SlotRow

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
