"""The control worker's placement step under a request's CEL budget (real PostgreSQL, the real
`choose_placement` activity): a request whose selectors pass the budget is refused with `selector_cost_exceeded` and
that is recorded as its end; the scheduler's levels run in a worker thread, so the worker's event loop (its other
activities, its workflow tasks) goes on meanwhile.

NESTED costs 532 on the example fleet's H200 device (two nested 10-element comprehensions); two distinct copies,
1,064, pass the budget of 1,000."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select
from temporalio.testing import ActivityEnvironment

from activities.control.placement import PlacementActivities
from contracts.allocation import AllocationRecord, AuditTrail, FindCandidatesInput, StateChange
from contracts.placement import PlacementRequest
from devstack.reports import report_hosts
from fleet.loader import load_fleet
from scheduler.cel import REQUEST_BUDGET
from store.apply import apply_fleet
from store.models import AllocationRow
from tests.cel_gate import Gate, gated_evaluation, unique_selector

__all__ = ["gated_evaluation"]  # the fixture, imported for pytest

TEN = "[500, 501, 502, 503, 504, 505, 506, 507, 508, 509]"
NESTED = f"{TEN}.all(a, {TEN}.all(b, a + b > 0))"
H200 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'


def _choose(allocation_id: str, request: PlacementRequest) -> FindCandidatesInput:
    opening = AllocationRecord(allocation_id=allocation_id, tenant="acme", request=request, workflow_id=allocation_id)
    step = StateChange(allocation_id=allocation_id, run_id="run-1", state="placing", step="select_region")
    return FindCandidatesInput(
        allocation_id=allocation_id,
        request=request,
        region="",
        trail=AuditTrail(opening=opening, changes=[step]),
        final=StateChange(allocation_id=allocation_id, run_id="run-1", state="failed", step="failed"),
    )


async def _fleet(sessions, examples_dir) -> None:  # type: ignore[no-untyped-def]
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    await report_hosts(sessions, fleet)


async def test_selectors_over_the_budget_end_the_allocation_with_selector_cost_exceeded(sessions, examples_dir) -> None:
    await _fleet(sessions, examples_dir)
    both = [NESTED, f"{NESTED} || false"]
    request = PlacementRequest(gpu_count=8, gpu_product="H200", tenant="acme", selectors=both)
    refused = await ActivityEnvironment().run(
        PlacementActivities(sessions).choose_placement, _choose("costly", request)
    )
    refusal = refused.refusal()
    assert refusal is not None and refused.final_recorded
    assert refusal.refusal_code == "selector_cost_exceeded"
    assert refusal.refusal_message == (
        f"the request's CEL selectors cost more than the budget of {REQUEST_BUDGET} that a request's selectors may "
        f"spend together (stopped in {both[1]!r})"
    )
    async with sessions() as session:
        row = await session.get(AllocationRow, "costly")
        assert row is not None and (row.state, row.failure_reason) == ("failed", refusal.reason)


async def test_the_placement_levels_run_off_the_worker_event_loop(
    sessions, examples_dir, gated_evaluation: Gate
) -> None:
    await _fleet(sessions, examples_dir)
    request = PlacementRequest(gpu_count=8, gpu_product="H200", tenant="acme", selectors=[unique_selector(H200)])
    step = asyncio.create_task(
        ActivityEnvironment().run(PlacementActivities(sessions).choose_placement, _choose("held", request))
    )
    assert await asyncio.to_thread(gated_evaluation.entered.wait, 60)
    async with sessions() as session:  # the loop serves other work while the selector is held
        opened = await session.scalar(select(func.count()).select_from(AllocationRow))
    gated_evaluation.release.set()
    choice = await step
    assert opened == 1 and not gated_evaluation.held_on_the_loop()
    assert choice.refusal() is None and choice.candidates is not None and choice.candidates.candidates
