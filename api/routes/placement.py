"""`POST /v1/explain` and `GET /v1/capacity`: the scheduler's own answers over a current snapshot of PostgreSQL
(the inventory kept by the app's `InventoryCache`, claims and usage read for each request).

Both are read-only: explain checks the request as create does (selectors compile; region, product and pinned nodes
exist: else 422), then runs the same pure scheduling pass an allocation would (region, cluster, and a preview
of the node scheduler on the chosen node) and returns its level-by-level explanation; capacity tells raw free GPUs
from what the node scheduler would actually accept.

What a tenant is shown is the fleet as it may use it (`api.request_checks.fleet_for`: the regions its policy admits,
their pools and nodes), and never another tenant's allocation ids: the scheduler's text says only that a slot is
claimed, leased or quarantined, and who holds which slot is the structured `holders` list, filled in for admins.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query
from pydantic import AwareDatetime

from api.auth import Viewer, acting_tenant
from api.cel_budget import explain_off_loop
from api.errors import error_responses
from api.request_checks import check_request, fleet_for
from api.services import Services, services
from contracts.http import AllocationCreate, CapacityAt, CapacityReport, Product
from contracts.manifest import Name
from contracts.placement import PlacementResult, PreemptionPreview, PreemptionVictim
from contracts.reasons import Reason
from scheduler.admission.preemption import Preemptor, plan_preemption
from scheduler.admission.reservations import capacity_at
from scheduler.placement.bundles import held_slots
from scheduler.placement.capacity import capacity
from scheduler.snapshot import Snapshot
from store import queue, reservations
from store.db import AsyncSession
from store.tokens import Principal

router = APIRouter(prefix="/v1", tags=["placement"])
App = Annotated[Services, Depends(services)]


def _shown_to(viewer: Principal, result: PlacementResult, snapshot: Snapshot, pinned: list[str]) -> PlacementResult:
    """`result` as `viewer` may read it. For an admin, `holders`: who holds each held slot of the nodes the result
    judged slot by slot (the pinned nodes, the chosen node), null when none is held. A tenant gets the scheduler's
    result as it is, which names no holder."""
    if not viewer.sees_all:
        return result
    nodes = sorted({*pinned, *([result.chosen.node] if result.chosen else [])} & snapshot.nodes.keys())
    holders = [held for node in nodes for held in held_slots(snapshot.nodes[node])]
    return result.model_copy(update={"holders": holders or None})


@router.post("/explain", response_model=PlacementResult, responses=error_responses(401, 403, 422))
async def explain(
    body: Annotated[AllocationCreate, Body()],
    caller: Viewer,
    app: App,
    detail: Annotated[bool, Query(description="Add per-candidate verdicts to every level.")] = False,
) -> PlacementResult:
    """Where this allocation would go now, or level by level why it would not; nothing is reserved. With an admin
    token and no `tenant`, tenant policy and quota are left out (the operator's view). A tenant's explain sees only
    the regions, pools and nodes it may use, and no other allocation's id."""
    tenant = body.tenant if caller.sees_all else acting_tenant(caller, body.tenant, act=False)
    async with app.sessions() as session:
        await check_request(session, app.inventory, body, caller)
        snapshot = fleet_for(await app.inventory.snapshot(session), caller)
    result = await explain_off_loop(body, snapshot, body.placement_request(tenant), detail)  # CEL: in a thread
    if result.refusal is not None:
        app.metrics.explain_refusals.labels(str(result.refusal.code)).inc()
        result = await _with_preemption(app, caller, body, tenant, snapshot, result)
    return _shown_to(caller, result, snapshot, body.nodes)


async def _with_preemption(
    app: Services,
    caller: Principal,
    body: AllocationCreate,
    tenant: str | None,
    snapshot: Snapshot,
    result: PlacementResult,
) -> PlacementResult:
    """A dry run of what a queued request like this one would preempt to be placed: the same rules as the
    admission pass, over the region's active allocations now. Nothing is told or held."""
    region = result.region or body.region
    code = str(result.refusal.code) if result.refusal is not None else ""
    if tenant is None or region is None or code not in (Reason.INSUFFICIENT_CAPACITY, Reason.QUOTA_EXCEEDED):
        return result
    async with app.sessions() as session:
        classes = await queue.class_facts(session)
        active = await queue.active_allocations(session, region)
    _, fact = classes.of(body.priority_class)
    preemptor = Preemptor(
        "explain",
        tenant,
        fact.value if fact else 0,
        time.time(),
        body.placement_request(tenant),
        preemptible=bool(fact and fact.preemptible),
        never_preempts=bool(fact and fact.never_preempts),
    )
    outcome = plan_preemption(snapshot, region, preemptor, [a.running for a in active], code)
    if isinstance(outcome, str):
        return result
    shown = [
        PreemptionVictim(
            allocation_id=holder_shown_to(caller, v.allocation_id, v.tenant),
            node=v.node,
            gpus=v.gpus,
            priority=v.priority,
            rule=outcome.reasons[v.allocation_id],
        )
        for v in outcome.victims
    ]
    return result.model_copy(
        update={"preemption": PreemptionPreview(case=outcome.case, node=outcome.node, victims=shown)}
    )


@router.get("/capacity", response_model=CapacityReport, responses=error_responses(401, 422))
async def get_capacity(
    caller: Viewer,
    app: App,
    region: Name | None = None,
    gpu_product: Product | None = None,
) -> CapacityReport:
    """Per pool: raw free GPUs, how many 1, 2, 4 and 8-GPU slices would fit now, and whole bare-metal nodes. A
    tenant sees only the pools of the regions it may use."""
    async with app.sessions() as session:
        snapshot = fleet_for(await app.inventory.snapshot(session), caller)
        reserved = await reserved_now(session)
    return CapacityReport(pools=capacity(snapshot, region=region, gpu_product=gpu_product, reserved=reserved))


async def reserved_now(session: AsyncSession) -> dict[str, int]:
    """GPUs per node promised now to reservations whose window is open and whose allocation holds nothing yet."""
    now = time.time()
    reserved: dict[str, int] = {}
    for hold in await reservations.holds(session):
        if hold.window.start <= now < hold.window.end:
            reserved[hold.node] = reserved.get(hold.node, 0) + hold.gpus
    return reserved


def holder_shown_to(viewer: Principal, allocation_id: str, tenant: str | None) -> str | None:
    """The id of an allocation holding GPUs, as `viewer` may read it: an operator's or its own tenant's, else None
    (another tenant's work is only "in use"). The rule explain's holders and preemption victims follow."""
    return allocation_id if viewer.sees_all or (tenant is not None and viewer.may_see(tenant)) else None


@router.get("/capacity/at", response_model=CapacityAt, responses=error_responses(401, 422))
async def get_capacity_at(
    caller: Viewer,
    app: App,
    at: Annotated[AwareDatetime, Query(description="The instant (RFC 3339, with an offset).")],
    region: Name | None = None,
) -> CapacityAt:
    """Per pool at an instant: GPUs held then by running allocations that have not ended by it, promised
    to reservations whose window covers it, and free (in all, and the most on one node). A tenant sees only the
    pools of the regions it may use."""
    async with app.sessions() as session:
        snapshot = fleet_for(await app.inventory.snapshot(session), caller)
        holdings, reserved = [], []
        for name in sorted(snapshot.regions):
            if region is None or name == region:
                found = await reservations.window_facts(session, name)
                holdings += found[0]
                reserved += found[1]
    pools = [p for p in capacity_at(snapshot, at.timestamp(), holdings, reserved) if region in (None, p.region)]
    return CapacityAt(at=at, pools=pools)
