"""Creating a request that may wait: `queue: {timeout}` and `priority_class` on `POST /v1/allocations`,
checked against the fleet file before anything exists, and the tenant's waiting default.

The lab fleet (tests/api/stack.py): `globex` has a quota of 2 GPUs; host `small` (2 GPUs) makes a 2-GPU request
active in about a second; host `slow` never finishes booting. PriorityClasses and the tenants' queue settings are written straight into PostgreSQL, as
`berth apply` would write them.
"""

from __future__ import annotations

import uuid

from sqlalchemy import update

from store.models import PriorityClassRow, TenantRow
from tests.api.stack import Stack


def _key(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex}"


async def _create(stack: Stack, body: dict[str, object], headers: dict[str, str]) -> tuple[int, dict]:
    response = await stack.http.post("/v1/allocations", json=body, headers={**headers, "Idempotency-Key": _key("q")})
    return response.status_code, response.json()


async def _classes_and_policy(stack: Stack, **globex: object) -> None:
    async with stack.lab.sessions.begin() as session:
        await session.merge(PriorityClassRow(name="urgent", value=1000, is_default=False, description=None))
        await session.merge(PriorityClassRow(name="batch", value=-10, is_default=True, description=None))
        if globex:
            await session.execute(update(TenantRow).where(TenantRow.name == "globex").values(**globex))


async def test_a_waiting_request_over_the_tenants_quota_is_queued_then_placed(stack: Stack) -> None:
    status, first = await _create(stack, {"gpu_count": 2}, stack.globex)
    assert status == 202
    await stack.wait_for(first["id"], "active")

    # Pinned to `small` (host `slow` never boots): placed the moment globex's GPUs come back.
    body = {"gpu_count": 1, "queue": {"timeout": "10m"}, "nodes": ["small"]}
    status, waiting = await _create(stack, body, stack.globex)
    assert status == 202, waiting  # no 409: it waits for globex's own GPUs to come back
    queued = await stack.wait_for(waiting["id"], "queued")
    place = queued["queue"]
    assert place["region"] == "lab" and place["position"] == 1 and place["code"] == "quota_exceeded"
    assert place["priority"] == 0 and place["priority_class"] is None

    status, never = await _create(stack, {"gpu_count": 3, "queue": {"timeout": "10m"}}, stack.globex)
    assert status == 409 and never["error"]["code"] == "quota_exceeded"  # more than its quota: waiting cannot help

    assert (await stack.http.delete(f"/v1/allocations/{first['id']}", headers=stack.globex)).status_code == 202
    placed = await stack.wait_for(waiting["id"], "active")
    assert placed["queue"] is None
    assert (await stack.http.delete(f"/v1/allocations/{waiting['id']}", headers=stack.globex)).status_code == 202


async def test_priority_classes_and_timeouts_are_checked_against_the_fleet(stack: Stack) -> None:
    await _classes_and_policy(stack, priority_classes=["batch"], queue={"default_timeout": None, "max_timeout": 3600})
    wait = {"timeout": "30m"}

    status, body = await _create(stack, {"gpu_count": 1, "queue": wait, "priority_class": "nightly"}, stack.globex)
    assert status == 422 and body["error"]["code"] == "unknown_priority_class"
    assert body["error"]["details"][0]["field"] == "body.priority_class"
    status, body = await _create(stack, {"gpu_count": 1, "queue": wait, "priority_class": "urgent"}, stack.globex)
    assert status == 422 and body["error"]["code"] == "priority_class_not_allowed"
    assert body["error"]["message"] == "tenant globex may not use PriorityClass 'urgent'"
    status, body = await _create(stack, {"gpu_count": 1, "queue": {"timeout": "2h"}}, stack.globex)
    assert status == 422 and body["error"]["code"] == "queue_timeout_too_long"
    assert body["error"]["message"] == "tenant globex may wait at most 1h0m0s (its queue.maxTimeout); 2h0m0s was asked"
    status, body = await _create(stack, {"gpu_count": 1, "queue": {"timeout": "soon"}}, stack.globex)
    assert status == 422  # not a duration


async def test_the_tenants_default_timeout_makes_a_request_wait_and_the_default_class_applies(stack: Stack) -> None:
    await _classes_and_policy(stack, queue={"default_timeout": 600, "max_timeout": 3600})
    status, first = await _create(stack, {"gpu_count": 2}, stack.globex)
    await stack.wait_for(first["id"], "active")

    status, waiting = await _create(stack, {"gpu_count": 2}, stack.globex)  # says nothing: waits by default
    assert status == 202
    place = (await stack.wait_for(waiting["id"], "queued"))["queue"]
    assert (place["priority"], place["priority_class"]) == (-10, "batch")

    status, refused = await _create(stack, {"gpu_count": 2, "queue": {"timeout": "0"}}, stack.globex)
    assert status == 409 and refused["error"]["code"] == "quota_exceeded"  # timeout 0: it does not wait

    assert (await stack.http.post(f"/v1/allocations/{waiting['id']}/cancel", headers=stack.globex)).status_code == 202
    assert (await stack.wait_for(waiting["id"], "cancelled"))["queue"] is None
    assert (await stack.http.delete(f"/v1/allocations/{first['id']}", headers=stack.globex)).status_code == 202


async def test_a_fleet_apply_that_raises_the_quota_places_a_waiting_request_without_waiting_for_a_release(
    stack: Stack,
) -> None:
    """The apply asks for a walk of the queues (`queue-walk/<control queue>`): nothing else would place it here (no
    release comes, and the tests run no reconciler schedule)."""
    status, holder = await _create(stack, {"gpu_count": 2, "nodes": ["small"]}, stack.globex)
    assert status == 202
    await stack.wait_for(holder["id"], "active")
    status, waiting = await _create(
        stack, {"gpu_count": 1, "queue": {"timeout": "10m"}, "nodes": ["big"]}, stack.globex
    )
    assert status == 202
    assert (await stack.wait_for(waiting["id"], "queued"))["queue"]["code"] == "quota_exceeded"

    raised = "apiVersion: berth.dev/v1alpha1\nkind: Tenant\nmetadata: {name: globex}\nspec: {gpuQuota: 3}\n"
    applied = await stack.http.put("/v1/fleet", content=raised, headers=stack.admin)
    assert applied.status_code == 200, applied.text
    assert (await stack.wait_for(waiting["id"], "active"))["node"] == "big"
    for allocation in (holder, waiting):
        assert (await stack.http.delete(f"/v1/allocations/{allocation['id']}", headers=stack.globex)).status_code == 202


async def test_uncordoning_a_node_places_a_request_waiting_for_capacity_on_it(stack: Stack) -> None:
    assert (await stack.http.post("/v1/nodes/big/cordon", headers=stack.admin)).status_code == 200
    holder = await stack.create(2, nodes=["small"])
    await stack.wait_for(holder, "active")
    waiting = await stack.create(2, queue={"timeout": "10m"})  # small is full, big cordoned, slow too small
    assert (await stack.wait_for(waiting, "queued"))["queue"]["code"] == "insufficient_capacity"

    assert (await stack.http.post("/v1/nodes/big/uncordon", headers=stack.admin)).status_code == 200
    assert (await stack.wait_for(waiting, "active"))["node"] == "big"
    for allocation in (holder, waiting):
        assert (await stack.http.delete(f"/v1/allocations/{allocation}", headers=stack.acme)).status_code == 202
