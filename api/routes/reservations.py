"""`/v1/reservations`: GPUs promised for a future window, as AWS Capacity Blocks and GCP calendar-mode
reservations promise them.

A create is admitted only when one node of the region's pools for its shape can hold it in the window, counting
running allocations that still hold their GPUs at its start (a preemptible one does not: it is preempted then) and
every other reservation (scheduler/admission/reservations.py), decided under the region's placement lock so two creates
cannot both take the last GPUs of a window. Otherwise 409 `window_full` with what the window lacks and the nearest
windows that would fit. An admitted reservation is a durable workflow of its own (`reservation/<id>`,
workflows/reservation/workflow.py): `reserved` until its start, then its allocation, which expires at the window's end.
A tenant sees and cancels only its own.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from api.auth import Member, Viewer, acting_tenant, require_act
from api.errors import ApiError, error_responses, not_found
from api.long_poll import Wait, waiting
from api.request_checks import invalid_request
from api.services import Services, services
from contracts.allocation import RESERVATION_FINAL_STATES, RESERVATION_STATES
from contracts.http import (
    ReservationCreate,
    ReservationList,
    ReservationView,
)
from scheduler.admission.reservations import Admitted, Window, admit
from store import reservations
from store.decisions import lock_region
from store.models import ReservationRow
from store.tokens import Principal
from workflows.reservation.client import start_reservation, workflow_id

router = APIRouter(prefix="/v1/reservations", tags=["reservations"])
App = Annotated[Services, Depends(services)]
IdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="The reservation's id.")]


def _view(row: ReservationRow, pools: list[str] | None = None) -> ReservationView:
    return ReservationView(
        id=row.id,
        tenant=row.tenant,
        state=row.state,
        region=row.region,
        node=row.node_id,
        gpu_count=row.gpu_count,
        gpu_product=row.gpu_product,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        allocation_id=row.allocation_id,
        reason=row.reason,
        workflow_id=workflow_id(row.id),
        pools=pools or [],
    )


@router.post("", status_code=201, response_model=ReservationView, responses=error_responses(401, 403, 409, 422, 503))
async def create_reservation(body: Annotated[ReservationCreate, Body()], caller: Member, app: App) -> ReservationView:
    """Promise GPUs for a window: 201 when a node can hold them then, 409 `window_full` (with the nearest windows
    that fit) when none can."""
    tenant = acting_tenant(caller, body.tenant)
    starts, ends = body.starts_at, body.end()
    if starts <= datetime.now(UTC):
        raise invalid_request("body.starts_at", f"starts_at {starts.isoformat()} is not in the future", "window")
    if ends <= starts:
        raise invalid_request("body.ends_at", "ends_at is not after starts_at", "window")
    request = body.placement_request(tenant)
    await app.control.require_worker()
    window = Window(starts.timestamp(), ends.timestamp())
    async with app.sessions.begin() as session:
        snapshot = await app.inventory.snapshot(session)
        if body.region not in snapshot.regions:
            known = ", ".join(sorted(snapshot.regions)) or "none"
            raise ApiError(422, "unknown_region", f"region {body.region!r} does not exist (regions: {known})")
        if body.pool is not None:
            pool = next((p for p in snapshot.pools if p.key == body.pool and p.region == body.region), None)
            if pool is None:
                known = ", ".join(sorted(p.key for p in snapshot.pools if p.region == body.region)) or "none"
                raise ApiError(
                    422, "unknown_pool", f"region {body.region!r} has no pool {body.pool!r} (pools: {known})"
                )
            request = request.model_copy(update={"nodes": frozenset(pool.nodes)})
        await lock_region(session, body.region)
        holdings, reserved = await reservations.window_facts(session, body.region)
        decision = admit(snapshot, request, body.region, window, holdings, reserved)
        if not isinstance(decision, Admitted):
            suggestions = [{"starts_at": _at(w.start), "ends_at": _at(w.end)} for w in decision.suggestions]
            raise ApiError(409, "window_full", decision.message, {"nearest_windows": suggestions})
        row = ReservationRow(
            id=uuid.uuid4().hex[:16],
            tenant=tenant,
            region=body.region,
            node_id=decision.node,
            gpu_count=body.gpu_count,
            gpu_product=body.gpu_product,
            shape=body.shape.value,
            starts_at=starts,
            ends_at=ends,
            state="reserved",
        )
        await reservations.create(session, row)
        view = _view(row)
        # The workflow starts before the row commits: a start that fails rolls the row back, so no reservation holds
        # GPUs without a workflow to end it. A commit that fails after the start leaves a workflow without a row,
        # which holds nothing and fails at its start time (`start_reservation` finds no row).
        client: Client = await app.control.client()
        await start_reservation(
            client, row.id, tenant, row.node_id, request, starts, ends, app.timing, app.control.queues, caller.actor
        )
    return view


@router.get("", response_model=ReservationList, responses=error_responses(401))
async def list_reservations(caller: Viewer, app: App) -> ReservationList:
    """Reservations by start; a tenant token sees its own tenant's. Each with the pools its node is in."""
    async with app.sessions() as session:
        rows = await reservations.listed(session, caller.visible)
        snapshot = (await app.inventory.inventory(session)).snapshot if rows else None
    return ReservationList(
        reservations=[
            _view(row, [pool.key for pool in snapshot.pools_of(row.node_id)] if snapshot else None) for row in rows
        ]
    )


@router.get("/{reservation_id}", response_model=ReservationView, responses=error_responses(401, 404, 422))
async def get_reservation(
    reservation_id: IdPath,
    caller: Viewer,
    app: App,
    wait: Annotated[Wait | None, Depends(waiting("reservation", RESERVATION_STATES, RESERVATION_FINAL_STATES))],
) -> ReservationView:
    """One reservation. With `wait_for`, answered once it is in one of those states or a final one, or at
    `timeout` (api/long_poll.py)."""

    async def read() -> ReservationView:
        async with app.sessions() as session:
            return _view(await _visible(session, reservation_id, caller))

    return await wait.until(read, lambda view: view.state) if wait is not None else await read()


@router.delete(
    "/{reservation_id}", status_code=202, response_model=ReservationView, responses=error_responses(401, 404, 409, 503)
)
async def cancel_reservation(reservation_id: IdPath, caller: Member, app: App) -> ReservationView:
    """Cancel a reservation: before its start it holds nothing more; after, its allocation gives everything back."""
    async with app.sessions() as session:
        row = await _visible(session, reservation_id, caller)
    require_act(caller, row.tenant)
    if row.state not in reservations.OPEN_STATES:
        raise ApiError(409, "invalid_state", f"reservation {reservation_id} is {row.state}; it cannot be cancelled")
    await app.control.require_worker()
    client: Client = await app.control.client()
    handle = client.get_workflow_handle(workflow_id(reservation_id))
    try:
        running = (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError as error:
        if error.status is not RPCStatusCode.NOT_FOUND:
            raise
        running = False
    if running:
        await handle.cancel()  # the workflow records it (and cancels its allocation, once started)
    else:
        # No workflow runs to record the cancel (terminated from the Temporal UI, say: the reconciler reports it as
        # `abandoned_reservation`): the row is closed here, so that it promises its GPUs no longer.
        async with app.sessions.begin() as session:
            await reservations.close_open(session, reservation_id, "cancelled", "cancelled; its workflow had ended")
            row = await _visible(session, reservation_id, caller)
    return _view(row)


async def _visible(session: object, reservation_id: str, caller: Principal) -> ReservationRow:
    row = await reservations.get(session, reservation_id)  # type: ignore[arg-type]
    if row is None or not caller.may_see(row.tenant):
        raise not_found("reservation", reservation_id)
    return row


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()
