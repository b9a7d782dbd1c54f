"""Quota at create: a create the tenant's quota cannot hold now is a 409 `quota_exceeded` at once,
with the message placement would have failed it with, and leaves no row and no workflow; one within the quota is
accepted, and a retried Idempotency-Key of an accepted create is still answered 200.

The lab fleet (tests/api/stack.py): `globex` has a quota of 2 GPUs; host `small` (2 GPUs) makes a 2-GPU request
active in about a second.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import func, select
from temporalio.service import RPCError, RPCStatusCode

from api.routes.allocations import keyed_allocation_id
from store.models import AllocationRow
from tests.api.stack import Stack
from workflows.allocation.client import workflow_id

OVER = "tenant globex would exceed its GPU quota: 2 active + 0 in flight + 1 requested > quota 2"


async def _rows(stack: Stack, tenant: str) -> int:
    async with stack.lab.sessions() as session:
        count = await session.scalar(
            select(func.count()).select_from(AllocationRow).where(AllocationRow.tenant == tenant)
        )
    return int(count or 0)


async def _workflow_exists(stack: Stack, allocation_id: str) -> bool:
    try:
        await stack.lab.starter.get_workflow_handle(workflow_id(allocation_id)).describe()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


def _key(name: str) -> str:
    """Temporal outlives each test's database: keys (and so keyed workflow ids) must not repeat across tests."""
    return f"{name}-{uuid.uuid4().hex}"


async def _globex_full(stack: Stack, key: str | None = None) -> str:
    """globex holding its whole quota: one 2-GPU allocation, active (so the usage figures are settled)."""
    response = await stack.http.post(
        "/v1/allocations", json={"gpu_count": 2}, headers={**stack.globex, "Idempotency-Key": key or _key("first")}
    )
    assert response.status_code == 202, response.text
    allocation_id = response.json()["id"]
    await stack.wait_for(allocation_id, "active")
    return allocation_id


async def test_creates_beyond_the_quota_are_refused_and_create_nothing(stack: Stack) -> None:
    accepted = await _globex_full(stack)
    keys = [_key(f"over-{n}") for n in range(3)]
    for key in keys:
        response = await stack.http.post(
            "/v1/allocations", json={"gpu_count": 1}, headers={**stack.globex, "Idempotency-Key": key}
        )
        assert response.status_code == 409, response.text
        assert response.json()["error"] == {
            "code": "quota_exceeded",
            "message": OVER,
            "details": {
                "tenant": "globex",
                "gpu_quota": 2,
                "active_gpus": 2,
                "in_flight_gpus": 0,
                "requested_gpus": 1,
            },
        }
    # An admin asking on globex's behalf meets the same quota.
    on_behalf = await stack.http.post("/v1/allocations", json={"gpu_count": 1, "tenant": "globex"}, headers=stack.admin)
    assert on_behalf.status_code == 409 and on_behalf.json()["error"]["code"] == "quota_exceeded"

    assert await _rows(stack, "globex") == 1
    assert await _workflow_exists(stack, accepted)
    for key in keys:  # the id each refused key would have named was never started
        assert not await _workflow_exists(stack, keyed_allocation_id("globex", key))
    query = f"TaskQueue = '{stack.lab.queues.control}'"  # this lab's workflows only
    listed: set[str] = set()
    for _ in range(100):  # visibility is written after the start: wait for the accepted one to be listed
        # by id: the accepted allocation is two runs once active, its placement and its hold (continue-as-new)
        listed = {w.id async for w in stack.lab.starter.list_workflows(query)}
        if workflow_id(accepted) in listed:
            break
        await asyncio.sleep(0.1)
    assert listed == {workflow_id(accepted)}


async def test_the_refusal_is_the_one_placement_gives(stack: Stack) -> None:
    await _globex_full(stack)
    explained = await stack.http.post("/v1/explain", json={"gpu_count": 1}, headers=stack.globex)
    assert explained.status_code == 200, explained.text
    refusal = explained.json()["refusal"]
    created = await stack.http.post("/v1/allocations", json={"gpu_count": 1}, headers=stack.globex)
    assert created.status_code == 409
    assert (created.json()["error"]["code"], created.json()["error"]["message"]) == (
        refusal["code"],
        refusal["message"],
    )


async def test_a_create_within_the_quota_is_accepted(stack: Stack) -> None:
    first = await stack.create(1, stack.globex)
    second = await stack.create(1, stack.globex)  # 1 + 1 <= 2: still admitted, whatever state the first is in
    assert first != second
    third = await stack.http.post("/v1/allocations", json={"gpu_count": 1}, headers=stack.globex)
    assert third.status_code == 409, third.text
    details = third.json()["error"]["details"]
    assert details["active_gpus"] + details["in_flight_gpus"] == 2
    assert await _rows(stack, "globex") == 2
    # Other tenants' quotas are their own: acme is not held back by globex being full.
    assert await stack.create(1)


@pytest.mark.parametrize("who", ["globex", "admin"])
async def test_a_retried_key_of_an_accepted_create_is_answered_not_refused(stack: Stack, who: str) -> None:
    key = _key("first")
    accepted = await _globex_full(stack, key)
    headers = {**(stack.globex if who == "globex" else stack.admin), "Idempotency-Key": key}
    body = {"gpu_count": 2} | ({"tenant": "globex"} if who == "admin" else {})
    again = await stack.http.post("/v1/allocations", json=body, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == accepted
    assert await _rows(stack, "globex") == 1
