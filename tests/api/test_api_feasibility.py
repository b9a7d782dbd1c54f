"""Feasibility at create: a request no host of the fleet could ever hold is a 422 at once, with the largest host of
each kind, and creates no row and no workflow; one that only does not fit now is still accepted (and then fails
with its explanation). The lab fleet (tests/api/stack.py): one slice pool of H200 hosts with 1, 2 and 4 GPUs."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select

from store.models import AllocationRow
from tests.api.stack import Stack
from workflows.allocation.client import workflow_id


async def _created(stack: Stack) -> tuple[int, list[str]]:
    async with stack.lab.sessions() as session:
        rows = await session.scalar(select(func.count()).select_from(AllocationRow))
    query = f"WorkflowType = 'Allocation' AND TaskQueue = '{stack.lab.queues.control}'"  # this lab's allocations
    workflows = [w.id async for w in stack.lab.starter.list_workflows(query)]
    return int(rows or 0), workflows


async def test_a_request_no_host_could_hold_is_422_and_creates_nothing(stack: Stack) -> None:
    response = await stack.http.post("/v1/allocations", json={"gpu_count": 8}, headers=stack.acme)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "unsatisfiable"
    assert error["message"] == (
        "no gpu_slice host has 8 GPUs (the largest has 4); the fleet could never hold this request"
    )
    assert error["details"] == [{"region": "lab", "gpu_product": "h200", "shape": "gpu_slice", "largest_host_gpus": 4}]
    bare = await stack.http.post("/v1/allocations", json={"gpu_count": 1, "shape": "baremetal"}, headers=stack.acme)
    assert bare.status_code == 422 and bare.json()["error"]["details"] == []  # the lab has no bare-metal pool
    assert await _created(stack) == (0, [])


async def test_a_request_that_only_does_not_fit_now_is_accepted(stack: Stack) -> None:
    for node in ("slow", "small", "big"):
        assert (await stack.http.post(f"/v1/nodes/{node}/cordon", headers=stack.admin)).status_code == 200
    allocation_id = await stack.create(4)  # `big` could hold it once uncordoned
    failed = await stack.wait_for(allocation_id, "failed")
    assert failed["failure_reason"].startswith("insufficient_capacity"), failed["failure_reason"]
    for _ in range(100):  # the count of what a create makes sees this one (visibility follows the start)
        if await _created(stack) == (1, [workflow_id(allocation_id)]):
            break
        await asyncio.sleep(0.1)
    assert await _created(stack) == (1, [workflow_id(allocation_id)])
