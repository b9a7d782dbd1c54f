"""A tenant's CEL selectors cannot stall the API or the control worker: a selector too costly by its
estimate is a 422 `selector_cost_exceeded` at admission, a request whose selectors together pass their budget is a
422 from explain and a refusal with the same code for an allocation, and while explain evaluates, in a worker
thread, `/healthz` answers.

The lab fleet's pool publishes one device. NESTED costs 532 units on it (two nested 10-element comprehensions,
estimated 742: admitted alone); two distinct copies cost 1,064, past the budget of 1,000.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select

from api.cel_budget import MAX_SELECTOR_TEXT
from scheduler.cel import REQUEST_BUDGET, compile_selector
from store.models import AllocationRow
from tests.api.stack import Stack
from tests.cel_gate import Gate, gated_evaluation, unique_selector

__all__ = ["gated_evaluation"]  # the fixture, imported for pytest

TEN = "[500, 501, 502, 503, 504, 505, 506, 507, 508, 509]"
ISSUE = f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, {TEN}.all(d, a + b + c + d > 0))))"
NESTED = f"{TEN}.all(a, {TEN}.all(b, a + b > 0))"
H200 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'


async def _allocations(stack: Stack) -> int:
    async with stack.lab.sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(AllocationRow)) or 0)


async def test_a_selector_too_costly_by_its_estimate_is_422_and_creates_nothing(stack: Stack) -> None:
    body = {"gpu_count": 1, "selectors": [H200, ISSUE]}
    estimate = compile_selector(ISSUE).estimated_cost
    assert estimate > 100 * REQUEST_BUDGET
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json=body, headers=stack.acme)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "selector_cost_exceeded"
        assert error["message"].startswith("selectors[1]: CEL selector '[500, 501")
        assert error["message"].endswith(
            f"is too costly: its estimated cost {estimate} is over the budget of {REQUEST_BUDGET} that a request's "
            "selectors may spend together"
        )
        assert error["details"] == [
            {"field": "body.selectors[1]", "expression": ISSUE, "estimated_cost": estimate, "budget": REQUEST_BUDGET}
        ]
    assert await _allocations(stack) == 0


async def test_selectors_too_long_together_to_parse_are_422_and_create_nothing(stack: Stack) -> None:
    """Each within its own length, together past what a request may have parsed (api/cel_budget.MAX_SELECTOR_TEXT)."""
    short = f'device.driver == "gpu.nvidia.com" && {H200}'
    body = {"gpu_count": 1, "selectors": [short] * (MAX_SELECTOR_TEXT // len(short) + 1)}
    length = len(short) * len(body["selectors"])
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json=body, headers=stack.acme)
        assert response.status_code == 422, response.text
        assert response.json()["error"] == {
            "code": "selector_cost_exceeded",
            "message": f"the request's CEL selectors are {length} characters together; a request may carry at most "
            f"{MAX_SELECTOR_TEXT} (compiling them is part of what a request may spend)",
            "details": [{"field": "body.selectors", "characters": length, "limit": MAX_SELECTOR_TEXT}],
        }
    assert await _allocations(stack) == 0
    body["selectors"] = body["selectors"][: MAX_SELECTOR_TEXT // len(short)]  # at the bound: explained
    assert (await stack.http.post("/v1/explain", json=body, headers=stack.acme)).status_code == 200


async def test_selectors_that_together_pass_the_budget_are_refused_by_explain_and_placement(stack: Stack) -> None:
    """Each alone is admitted and explained; together they stop one unit past the budget, never more."""
    alone = await stack.http.post("/v1/explain", json={"gpu_count": 2, "selectors": [NESTED]}, headers=stack.acme)
    assert alone.status_code == 200 and alone.json()["placed"] is True, alone.text

    both = [NESTED, f"{NESTED} || false"]
    refused = await stack.http.post("/v1/explain", json={"gpu_count": 2, "selectors": both}, headers=stack.acme)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "selector_cost_exceeded"
    assert error["message"] == (
        f"the request's CEL selectors cost more than the budget of {REQUEST_BUDGET} that a request's selectors may "
        f"spend together (stopped in {both[1]!r})"
    )
    assert error["details"] == [
        {"field": "body.selectors[1]", "expression": both[1], "cost": REQUEST_BUDGET + 1, "budget": REQUEST_BUDGET}
    ]

    # An allocation is admitted (each selector's estimate fits) and its placement step refuses it with the same code.
    allocation_id = await stack.create(2, selectors=both)
    failed = await stack.wait_for(allocation_id, "failed")
    assert failed["failure_reason"].startswith(
        f"selector_cost_exceeded: the request's CEL selectors cost more than the budget of {REQUEST_BUDGET}"
    )
    normal = await stack.create(2, selectors=[H200])  # and the next tenant request places as before
    assert (await stack.wait_for(normal, "active"))["node"] == "small"


async def test_healthz_answers_while_explain_evaluates_selectors_in_a_worker_thread(
    stack: Stack, gated_evaluation: Gate
) -> None:
    selector = unique_selector(H200)
    explain = asyncio.create_task(
        stack.http.post("/v1/explain", json={"gpu_count": 2, "selectors": [selector]}, headers=stack.acme)
    )
    assert await asyncio.to_thread(gated_evaluation.entered.wait, 60)
    health = await stack.http.get("/healthz")  # answered while the evaluation is held
    gated_evaluation.release.set()
    explained = await explain
    assert health.status_code == 200, health.text
    assert not gated_evaluation.held_on_the_loop()
    assert explained.status_code == 200 and explained.json()["placed"] is True
