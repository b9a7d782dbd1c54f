"""Two requests decided one after the other must not both be sent to the same node first: the first decision's
tentative choice is visible to the second (real PostgreSQL, the real find_candidates activity)."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.contracts import AllocationRecord, FindCandidatesInput
from activities.control.placement import PlacementActivities
from activities.control.records import RecordActivities
from devstack.reports import report_hosts
from fleet.loader import load_fleet
from scheduler.request import PlacementRequest
from store.apply import apply_fleet
from store.models import AllocationRow


async def test_a_tentative_choice_steers_the_next_decision(sessions, examples_dir) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    env, placement, records = ActivityEnvironment(), PlacementActivities(sessions), RecordActivities(sessions)
    request = PlacementRequest(gpu_count=8, gpu_product="H200", tenant="acme")
    firsts = []
    for allocation in ("first", "second"):
        await env.run(records.open_allocation, AllocationRecord(allocation_id=allocation, tenant="acme",
                                                                request=request, workflow_id=allocation))  # fmt: skip
        found = await env.run(placement.find_candidates, FindCandidatesInput(allocation_id=allocation, request=request,
                                                                              region="us-east"))  # fmt: skip
        firsts.append(found.candidates[0].node)
        second_choices = [c.node for c in found.candidates]
    assert firsts[0] != firsts[1]
    assert firsts[0] not in second_choices  # the whole host is spoken for while "first" is being planned there
    async with sessions() as session:
        row = await session.get(AllocationRow, "first")
    assert (row.state, row.node_id) == ("planning", firsts[0])
