"""`/v1/allocations`: create, read, list, cancel, retry and release GPU allocations.

Every action goes through the allocation's Temporal workflow; the API never changes an allocation's capacity
itself. Creation is exactly once per tenant and Idempotency-Key, whatever fails in between: the allocation's id,
and so its workflow id, is derived from the two, and the workflow id is the lock (Temporal starts one workflow per
id). The workflow's memo keeps a fingerprint of the request that started it, so a retried key is told apart from a
reused one. The answer follows what Temporal accepted:

- a selector that does not compile, or a region, product or pinned node the fleet does not have: 422 with the
  position or the valid choices (api/request_checks.py), and nothing was created; so is a request no host of the
  fleet could ever hold (`unsatisfiable`, api/feasibility.py);
- more creates than the tenant's `rateLimit` allows: 429 `rate_limited` with `Retry-After` (api/rate_limit.py),
  before anything is checked or created;
- a request the tenant's quota cannot hold now: 409 `quota_exceeded`, the message placement would fail it with,
  and nothing was created (api/feasibility.py; placement stays the authority);
- PostgreSQL or Temporal unreachable before the start: 503, and nothing was created;
- the start accepted: 202, even when writing the allocation's row then fails (the workflow writes the same row,
  key included, as its first step, so the allocation appears as soon as PostgreSQL is back);
- the same key again, with the same body: 200 and the same allocation; with another body: 409. The key is looked
  up before the rate limit and the quota, so a retry of an accepted create is answered, not refused.

Lists are keyset-paged, newest first by `(created_at, id)`, with an opaque `next_cursor` (api/cursor.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Response
from pydantic import ValidationError

from api import allocation_view, cursor
from api.auth import Member, Operator, Viewer, acting_tenant, require_act
from api.cursor import CursorParam
from api.errors import ApiError, ErrorEnvelope, conflict, error_responses
from api.feasibility import check_quota, check_satisfiable, queue_ceiling
from api.long_poll import Wait, waiting
from api.queue_wait import queue_wait, within_nominal
from api.request_checks import check_request
from api.services import Services, services
from api.temporal import Refused, WorkflowGone
from config import tracing
from contracts.allocation import ALLOCATION_STATES, FINAL_STATES, HOLDING_STATES, PLACING_STATES, RUNNING_STATES
from contracts.http import (
    RECORDED,
    AllocationAccepted,
    AllocationCreate,
    AllocationDetail,
    AllocationEnd,
    AllocationId,
    AllocationList,
    AllocationState,
    ExtendBody,
    IdempotencyKey,
    RetryBody,
)
from contracts.manifest import Name
from scheduler.admission.reservations import latest_end
from store import allocations as store
from store import reservations, trail
from store.db import AsyncSession
from store.decisions import lock_region
from store.models import AllocationRow
from store.outage import is_database_outage
from store.tokens import Principal
from workflows.allocation.client import workflow_id
from workflows.allocation.messages import AllocationInput, ExtendRequest, QueueWait

log = logging.getLogger("berth.api")
router = APIRouter(prefix="/v1/allocations", tags=["allocations"])
App = Annotated[Services, Depends(services)]
IdPath = Annotated[AllocationId, Path(description="The allocation's id.")]


def keyed_allocation_id(tenant: str, key: str) -> str:
    """The one allocation id a tenant's Idempotency-Key can ever name (16 hex digits, as random ids are)."""
    return hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()[:16]


def fingerprint(recorded: dict[str, object]) -> str:
    """A request's identity for Idempotency-Key comparisons: its normalised body (tenant included)."""
    return hashlib.sha256(json.dumps(recorded, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _key_reused(key: str, allocation_id: str) -> ApiError:
    return ApiError(
        409,
        "idempotency_conflict",
        f"Idempotency-Key {key!r} was already used for allocation {allocation_id} with a different body",
        {"allocation_id": allocation_id},
    )


def _input(
    app: Services,
    allocation_id: str,
    body: AllocationCreate,
    exclude_nodes: list[str],
    key: str | None = None,
    wait: QueueWait | None = None,
    nominal_only: bool = False,
    actor: str | None = None,
) -> AllocationInput:
    tenant = body.tenant
    assert tenant is not None  # the recorded body always names its tenant
    return AllocationInput(
        allocation_id=allocation_id,
        tenant=tenant,
        request=body.placement_request(tenant, frozenset(exclude_nodes), within_nominal=nominal_only),
        image=body.image,
        ssh_public_keys=body.ssh_public_keys,
        user_data=body.user_data,
        labels=body.labels,
        request_body=body.model_dump(mode="json"),
        idempotency_key=key,
        timing=app.timing,
        queues=app.control.queues,
        queue=wait,
        lease=body.lease(),
        actor=actor,
    )


async def _replay(session: AsyncSession, tenant: str, key: str, body: dict[str, object]) -> AllocationAccepted | None:
    """The allocation an earlier request with this Idempotency-Key created, if any; 409 if its body differed."""
    row = await store.by_idempotency_key(session, tenant, key)
    if row is None:
        return None
    if row.request != body:
        raise _key_reused(key, row.id)
    return AllocationAccepted(id=row.id, state=row.state, workflow_id=row.workflow_id)


@router.post(
    "",
    status_code=202,
    response_model=AllocationAccepted,
    responses={
        200: {
            "model": AllocationAccepted,
            "description": "An Idempotency-Key replay: the allocation the first request created.",
        },
        **error_responses(401, 403, 409, 422, 503),
        429: {
            "model": ErrorEnvelope,
            "description": "`rate_limited`: more creates than the tenant's `rateLimit`; retry after `Retry-After` s.",
        },
    },
)
async def create_allocation(
    body: Annotated[AllocationCreate, Body()],
    caller: Member,
    app: App,
    response: Response,
    idempotency_key: Annotated[IdempotencyKey | None, Header(description="Same key and body: same allocation.")] = None,
) -> AllocationAccepted:
    """Request GPUs. Answers 202 once the allocation's workflow has started; follow it with `GET .../{id}`."""
    tenant = acting_tenant(caller, body.tenant)
    body = body.model_copy(update={"tenant": tenant})
    recorded = body.model_dump(mode="json")
    async with app.sessions() as session:
        tenant_row = await store.load_tenant(session, tenant)
        if tenant_row is None:
            problem = {"field": "body.tenant", "message": "is not a tenant of the fleet", "type": "unknown"}
            raise ApiError(422, "unknown_tenant", f"tenant {tenant!r} does not exist", [problem])
        if idempotency_key is not None and (earlier := await _replay(session, tenant, idempotency_key, recorded)):
            response.status_code = 200
            return earlier
        await app.create_limits.check(app.sessions, tenant, tenant_row.rate_limit, caller)  # 429 before costlier checks
        await check_request(session, app.inventory, body, caller)  # 422 before anything exists: no row, no workflow
        snapshot = (await app.inventory.inventory(session)).snapshot
        check_satisfiable(snapshot, body)  # no host that big: 422 as well
        wait = await queue_wait(session, tenant_row, body)  # its queue timeout and priority: 422 if not allowed
        nominal_only = await within_nominal(session, body.priority_class)  # a non-preemptible class never borrows
        if wait is None or body.gpu_count > queue_ceiling(snapshot, tenant_row, body.placement_request(tenant)):
            await check_quota(session, snapshot, body, nominal_only)  # over quota now: 409 (one that waits may wait)
    await app.control.require_worker()

    allocation_id = keyed_allocation_id(tenant, idempotency_key) if idempotency_key else uuid.uuid4().hex[:16]
    tracing.tag_allocation(allocation_id)
    request = fingerprint(recorded)
    started = _input(app, allocation_id, body, [], idempotency_key, wait, nominal_only, caller.actor)
    outcome = await app.control.start(started, request)
    if not outcome.started:  # this key's workflow already exists: an earlier request's answer was lost
        assert idempotency_key is not None  # a random id never collides
        if outcome.fingerprint and outcome.fingerprint != request:
            raise _key_reused(idempotency_key, allocation_id)
        response.status_code = 200
    state = await _record(app, started)
    return AllocationAccepted(id=allocation_id, state=state, workflow_id=workflow_id(allocation_id))


async def _record(app: Services, started: AllocationInput) -> str:
    """Open the allocation's row so that reads find it at once; its state. The row's one writer is its trail: this
    is the opening the workflow's first step writes (`AllocationInput.opening`), written early for a fast read,
    and whichever comes second changes nothing. Best effort: an outage here costs only that head start."""
    allocation_id = started.allocation_id
    try:
        async with app.sessions.begin() as session:
            return await trail.open_row(session, started.opening(workflow_id(allocation_id)))
    except Exception as error:
        if not is_database_outage(error):
            raise
        log.warning("allocation %s accepted; its row waits for PostgreSQL (%s)", allocation_id, error)
        return "pending"


async def _state(app: Services, allocation_id: str, caller: Principal) -> str:
    """The allocation's state as its GET would answer it (the running workflow's own, else its row's), read without
    holding a database session while the workflow is asked."""
    async with app.sessions() as session:
        row = await allocation_view.visible_allocation(session, allocation_id, caller)
    if row.state in FINAL_STATES:
        return row.state
    live = await app.control.live_status(allocation_id)
    return live.state if live is not None else row.state


@router.get("/{allocation_id}", response_model=AllocationDetail, responses=error_responses(401, 404, 422))
async def get_allocation(
    allocation_id: IdPath,
    caller: Viewer,
    app: App,
    wait: Annotated[Wait | None, Depends(waiting("allocation", ALLOCATION_STATES, FINAL_STATES))],
) -> AllocationDetail:
    """One allocation: where it is, its attempts node by node, and every step it went through. With `wait_for`,
    answered once it is in one of those states or a final one, or at `timeout` (api/long_poll.py)."""
    if wait is not None:
        await wait.until(lambda: _state(app, allocation_id, caller), str)
    async with app.sessions() as session:
        row = await allocation_view.visible_allocation(session, allocation_id, caller)
        live = await app.control.live_status(allocation_id) if row.state not in FINAL_STATES else None
        return await allocation_view.detail(session, row, live, caller, app.inventory)


@router.get("", response_model=AllocationList, responses=error_responses(401, 422))
async def list_allocations(
    caller: Viewer,
    app: App,
    state: AllocationState | None = None,
    region: Name | None = None,
    node: Name | None = None,
    tenant: Annotated[Name | None, Query(description="Only this tenant's (one the caller belongs to).")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many on the page.")] = 100,
    cursor_: Annotated[CursorParam, Query(alias="cursor")] = None,
) -> AllocationList:
    """Allocations, newest first, a page at a time: follow `next_cursor` until it is null for every one. A tenant
    token lists only its own tenant's."""
    before = None
    if cursor_ is not None:
        at, last = cursor.decode(cursor_, "allocations", 2)
        before = (cursor.timestamp(cursor_, at), last)
    async with app.sessions() as session:
        rows = await store.allocation_page(
            session,
            state=state,
            region=region,
            node=node,
            tenant=tenant,
            visible_to=caller.visible,  # a caller in no tenant sees none
            before=before,
            limit=limit + 1,
        )
    page = [allocation_view.summary(*row) for row in rows[:limit]]
    more = len(rows) > limit
    return AllocationList(allocations=page, next_cursor=_position(page[-1].created_at, page[-1].id) if more else None)


def _position(created_at: datetime, allocation_id: str) -> str:
    return cursor.encode("allocations", created_at.isoformat(), allocation_id)


@router.post(
    "/{allocation_id}/cancel",
    status_code=202,
    response_model=AllocationAccepted,
    responses=error_responses(401, 404, 409, 422, 503),
)
async def cancel_allocation(allocation_id: IdPath, caller: Member, app: App) -> AllocationAccepted:
    """Cancel an allocation waiting in a queue, being placed or active: its workflow undoes everything and ends
    `cancelled`. One already cancelled answers 202 as well, so a cancel sent again after a lost answer (503
    `outcome_unknown`) is told it is done rather than refused."""
    async with app.sessions() as session:
        row = await allocation_view.visible_allocation(session, allocation_id, caller)
    require_act(caller, row.tenant)
    if row.state in CANCEL_DONE or await _cancelling(app, row.id, row.state):
        return AllocationAccepted(id=row.id, state=row.state, workflow_id=row.workflow_id)
    if row.state not in (*PLACING_STATES, "queued", *HOLDING_STATES):
        raise conflict(
            f"allocation {allocation_id} is {row.state}; only one queued, being placed or active can be cancelled"
        )
    await app.control.require_worker()
    # The row trails the workflow by a step (its trail rides with the next control step), so answer with the state
    # the workflow itself reports, as a read does.
    live = await app.control.live_status(allocation_id)
    try:
        async with allocation_view.requested(app, row, "cancel_requested", caller):
            await app.control.cancel(allocation_id)
    except (Refused, WorkflowGone):  # cancelled by an earlier request (ended, or giving back), or otherwise
        return await _already(app, row, CANCEL_DONE, cancelling=True)
    return AllocationAccepted(id=row.id, state=live.state if live else row.state, workflow_id=row.workflow_id)


@router.post(
    "/{allocation_id}/retry",
    status_code=202,
    response_model=AllocationAccepted,
    responses=error_responses(401, 404, 409, 422, 503),
)
async def retry_allocation(
    allocation_id: IdPath, caller: Operator, app: App, body: Annotated[RetryBody | None, Body()] = None
) -> AllocationAccepted:
    """Being placed: abandon the current node and go on with the next. Failed: place it again, as a new run."""
    exclude_nodes = body.exclude_nodes if body is not None else []
    async with app.sessions() as session:
        row = await allocation_view.visible_allocation(session, allocation_id, caller)
    if row.state != "failed":
        if row.state in FINAL_STATES:  # released or cancelled: its workflow has ended and takes no update
            raise _not_retryable(allocation_id, row.state)
        await app.control.require_worker()
        try:
            async with allocation_view.requested(app, row, "retry_requested", caller):
                await app.control.retry(allocation_id, exclude_nodes)  # the workflow's validator decides
        except Refused as refused:
            if refused.state is None:
                raise
            raise _not_retryable(allocation_id, refused.state) from refused
        return AllocationAccepted(id=row.id, state=row.state, workflow_id=row.workflow_id)
    try:
        request = AllocationCreate.model_validate(row.request, context=RECORDED)  # its durations in seconds
    except ValidationError as error:
        raise conflict(f"allocation {allocation_id} was not created through the API; it cannot be restarted") from error
    await app.control.require_worker()
    # The workflow id is the lock, as for create: of two retries racing, Temporal starts one new run and refuses the
    # other (409). Once it has accepted the run the answer is 202; the row follows, here or from the run's own trail.
    async with app.sessions() as session:  # it waits again as its body asked, under today's fleet file
        tenant_row = await store.load_tenant(session, row.tenant)
        wait = await queue_wait(session, tenant_row, request) if tenant_row is not None else None
        nominal_only = await within_nominal(session, request.priority_class)
    async with allocation_view.requested(app, row, "retry_requested", caller):
        await app.control.restart(
            _input(app, allocation_id, request, exclude_nodes, row.idempotency_key, wait, nominal_only, caller.actor)
        )
    try:
        async with app.sessions.begin() as session:
            await store.record_restarted(session, allocation_id)
    except Exception as error:
        if not is_database_outage(error):
            raise
        log.warning("allocation %s restarted; its row waits for PostgreSQL (%s)", allocation_id, error)
    return AllocationAccepted(id=row.id, state="pending", workflow_id=row.workflow_id)


@router.delete(
    "/{allocation_id}",
    status_code=202,
    response_model=AllocationAccepted,
    responses=error_responses(401, 404, 409, 422, 503),
)
async def release_allocation(allocation_id: IdPath, caller: Member, app: App) -> AllocationAccepted:
    """Release an active allocation: its VM is destroyed, its GPUs wiped and returned; it ends `released`. As a
    DELETE should be, it is idempotent: one already releasing or released answers 202 with that state, so a release
    sent again after a lost answer (503 `outcome_unknown`) is told it is done rather than refused."""
    async with app.sessions() as session:
        row = await allocation_view.visible_allocation(session, allocation_id, caller)
    require_act(caller, row.tenant)
    if row.state in RELEASE_DONE:
        return AllocationAccepted(id=row.id, state=row.state, workflow_id=row.workflow_id)
    if row.state in FINAL_STATES:  # its workflow has ended and takes no update: the row is the answer
        raise _not_releasable(allocation_id, row.state)
    await app.control.require_worker()
    try:
        async with allocation_view.requested(app, row, "release_requested", caller):
            status = await app.control.release(allocation_id)  # the workflow's validator decides
    except Refused as refused:
        if refused.state in RELEASE_DONE:
            return AllocationAccepted(id=row.id, state=refused.state, workflow_id=row.workflow_id)
        if refused.state is None:
            raise
        raise _not_releasable(allocation_id, refused.state) from refused
    except WorkflowGone:  # it ended between the read above and the call
        return await _already(app, row, RELEASE_DONE)
    return AllocationAccepted(id=row.id, state=status.state, workflow_id=row.workflow_id)


# The states in which a release, or a cancel, has already been carried out: asked again, each answers 202.
RELEASE_DONE = ("releasing", "released")
CANCEL_DONE = ("cancelled",)


async def _already(
    app: Services, row: AllocationRow, done: tuple[str, ...], *, cancelling: bool = False
) -> AllocationAccepted:
    """The answer to an action whose workflow refused it or had ended when asked: 202 when the row, read again,
    shows the action done (an earlier request carried it out) or, for a cancel, under way; else 409 naming the
    state it is in."""
    async with app.sessions() as session:
        now = await store.load_allocation(session, row.id)
    state = now.state if now is not None else row.state
    if cancelling and state not in done:  # the row trails the workflow by a step: ask the workflow where it is
        live = await app.control.live_status(row.id)
        state = live.state if live is not None and live.state in ("releasing", *done) else state
    if state in done or (cancelling and await _cancelling(app, row.id, state)):
        return AllocationAccepted(id=row.id, state=state, workflow_id=row.workflow_id)
    raise conflict(f"allocation {row.id} is {state}; its workflow has ended")


async def _cancelling(app: Services, allocation_id: str, state: str) -> bool:
    """An earlier cancel is being carried out: the allocation gives back what it held (`releasing`) because someone
    asked to cancel it. A cancel sent again then (a retry after a lost answer) is told it is under way, not
    refused, as one sent after it ended `cancelled` is."""
    if state != "releasing":
        return False
    async with app.sessions() as session:
        return await trail.was_requested(session, allocation_id, "cancel_requested")


@router.post(
    "/{allocation_id}/extend",
    response_model=AllocationEnd,
    responses=error_responses(401, 404, 409, 422, 503),
)
async def extend_allocation(
    allocation_id: IdPath, body: Annotated[ExtendBody, Body()], caller: Member, app: App
) -> AllocationEnd:
    """Move an active allocation's end later (`by` a duration, or `until` a time). 409 `invalid_state` when it is
    not active or has no end; 409 `extend_refused` when the new end is not later, past its pool's `maxLease`, or
    past the start of a reservation that needs its node's GPUs then."""
    async with app.sessions() as session:
        row = await allocation_view.visible_allocation(session, allocation_id, caller)
    require_act(caller, row.tenant)
    if row.state not in RUNNING_STATES:
        # Refused before the lock below is taken: a workflow still placing may be waiting for that same lock in a
        # control step, and its update could then not be delivered until the API's call gave up.
        raise conflict(f"allocation {allocation_id} is {row.state}; only an active one can be extended")
    await app.control.require_worker()
    # Decided under the region's placement lock, as a reservation's admission is: the limit its node's reservations
    # set goes with the update (its workflow knows its own end and decides), and the new end is on its row before
    # the lock is let go, so neither can promise the other's GPUs.
    async with app.sessions.begin() as session:
        limit = await _reservations_limit(session, app, row.id, row.region)
        request = ExtendRequest(seconds=body.by, ends_at=body.until, not_after=limit[0], not_after_reason=limit[1])
        try:
            async with allocation_view.requested(app, row, "extend_requested", caller):
                status = await app.control.extend(allocation_id, request)  # the workflow's validator decides
        except Refused as refused:
            if refused.state is None:
                raise ApiError(409, "extend_refused", refused.message) from refused
            raise conflict(
                f"allocation {allocation_id} is {refused.state}; {refused.message.split('; ', 1)[-1]}"
            ) from refused
        if status.ends_at is not None:
            await store.record_end(session, allocation_id, status.ends_at)
    return AllocationEnd(id=row.id, state=status.state, ends_at=status.ends_at)


async def _reservations_limit(
    session: AsyncSession, app: Services, allocation_id: str, region: str | None
) -> tuple[datetime | None, str | None]:
    """The latest end the reservations of the allocation's node allow it (scheduler.admission.reservations.latest_end)."""
    if region is None:
        return None, None
    await lock_region(session, region)
    snapshot = await app.inventory.snapshot(session)
    holdings, reserved = await reservations.window_facts(session, region)
    limit = latest_end(snapshot, allocation_id, holdings, reserved)
    return (datetime.fromtimestamp(limit.at, UTC), limit.reason) if limit is not None else (None, None)


# Retry and release are the workflow's to refuse (its update validators know its state; the row may trail it by a
# step). A refusal is answered in the API's own words, naming the state the workflow refused in; an allocation whose
# workflow has ended is answered from its row, since an ended workflow takes no update.


def _not_retryable(allocation_id: str, state: str) -> ApiError:
    return conflict(f"allocation {allocation_id} is {state}; only one being placed or failed can be retried")


def _not_releasable(allocation_id: str, state: str) -> ApiError:
    hint = " (cancel it instead)" if state in (*PLACING_STATES, "queued") else ""
    return conflict(f"allocation {allocation_id} is {state}; only an active one can be released{hint}")
