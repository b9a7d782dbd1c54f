"""Two requests decided one after the other must not both be sent to the same node first: the first decision's
tentative choice is visible to the second (real PostgreSQL, the real find_candidates activity)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.testing import ActivityEnvironment

from activities.control.placement import PlacementActivities
from activities.control.records import RecordActivities
from contracts.allocation import AllocationRecord, AuditTrail, FindCandidatesInput, StateChange
from contracts.placement import PlacementRequest
from devstack.reports import report_hosts
from fleet.loader import load_fleet
from scheduler.cel import RequestBudget
from scheduler.placement import cluster
from scheduler.placement.pending import with_pending_plans
from store.apply import apply_fleet
from store.decisions import record_first_choice
from store.liveness import mark_down
from store.models import AllocationEventRow, AllocationRow, ClaimRow, SlotRow


async def test_a_tentative_choice_steers_the_next_decision(sessions, examples_dir) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    env, placement, records = ActivityEnvironment(), PlacementActivities(sessions), RecordActivities(sessions)
    request = PlacementRequest(gpu_count=8, gpu_product="H200", tenant="acme")
    firsts = []
    for allocation in ("first", "second"):
        opening = AllocationRecord(allocation_id=allocation, tenant="acme", request=request, workflow_id=allocation)
        await env.run(records.record_trail, AuditTrail(opening=opening))
        found = await env.run(
            placement.find_candidates, FindCandidatesInput(allocation_id=allocation, request=request, region="us-east")
        )
        firsts.append(found.candidates[0].node)
        second_choices = [c.node for c in found.candidates]
    assert firsts[0] != firsts[1]
    assert firsts[0] not in second_choices  # the whole host is spoken for while "first" is being planned there
    async with sessions() as session:
        row = await session.get(AllocationRow, "first")
    assert (row.state, row.node_id) == ("planning", firsts[0])


async def test_a_refusal_is_recorded_as_the_end_and_retracted_by_a_later_try_that_places(
    sessions, examples_dir
) -> None:
    """`choose_placement` records a refusal as the allocation's final step itself (revision 1). Its result can be
    lost (the worker dies before the workflow task completes) and the step run again on a fleet that changed
    meanwhile: a try that places must leave no trace of the refusal the lost try recorded."""
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    reporting = await report_hosts(sessions, fleet)
    env, placement = ActivityEnvironment(), PlacementActivities(sessions)
    request = PlacementRequest(gpu_count=8, gpu_product="H200", tenant="acme")
    opening = AllocationRecord(allocation_id="lost", tenant="acme", request=request, workflow_id="allocation/lost")
    step = StateChange(allocation_id="lost", run_id="run-1", state="placing", step="select_region")
    choose = FindCandidatesInput(
        allocation_id="lost",
        request=request,
        region="",
        trail=AuditTrail(opening=opening, changes=[step]),
        final=StateChange(allocation_id="lost", run_id="run-1", state="failed", step="failed"),
    )

    async with sessions.begin() as session:  # every agent silent: no node can be ranked
        for node in reporting:
            await mark_down(session, node, "agent_unreachable: test")
    refused = await env.run(placement.choose_placement, choose)
    assert refused.final_recorded and refused.refusal() is not None
    async with sessions() as session:
        row = await session.get(AllocationRow, "lost")
        assert row is not None and (row.state, row.failure_reason) == ("failed", refused.refusal().reason)
        assert await _steps(session, "lost") == [
            ("select_region", "placing"),
            ("find_candidates", "placing"),
            ("failed", "failed"),
        ]

    await report_hosts(sessions, fleet)  # the agents are back; the lost try's answer never reached the workflow
    placed = await env.run(placement.choose_placement, choose)
    assert not placed.final_recorded and placed.refusal() is None and placed.candidates
    async with sessions() as session:
        row = await session.get(AllocationRow, "lost")
        assert row is not None and row.state == "planning" and row.failure_reason is None
        assert ("failed", "failed") not in await _steps(session, "lost")


async def _steps(session: AsyncSession, allocation: str) -> list[tuple[str, str]]:
    rows = await session.execute(
        select(AllocationEventRow.step, AllocationEventRow.state)
        .where(AllocationEventRow.allocation_id == allocation)
        .order_by(AllocationEventRow.id)
    )
    return [(step, state) for step, state in rows]


async def test_a_choice_whose_node_was_taken_meanwhile_is_ranked_again(sessions, examples_dir) -> None:
    """The ranking runs outside the region's lock; the choice is recorded only if the chosen node's plans are those
    the ranking saw. Here another decision records the same whole host between this one's read and its record:
    this one must not be written on that host, but ranked again and recorded on another."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    placement, records, env = PlacementActivities(sessions), RecordActivities(sessions), ActivityEnvironment()
    request = PlacementRequest(gpu_count=8, gpu_product="H200", tenant="acme")
    for allocation in ("early", "late"):
        opening = AllocationRecord(allocation_id=allocation, tenant="acme", request=request, workflow_id=allocation)
        await env.run(records.record_trail, AuditTrail(opening=opening))

    base, stale, _ = await placement._read("late", request)  # "late" reads and ranks first...
    best = cluster.find_candidates(with_pending_plans(base, stale), request, "us-east").candidates[0].node
    early = await record_first_choice(sessions, "us-east", "early", best, seen=[])  # ..."early" records first
    assert early.recorded

    found = await placement._candidates(base, stale, request, "us-east", "late", RequestBudget())
    assert found.candidates and found.candidates[0].node != best
    async with sessions() as session:
        rows = {a: await session.get(AllocationRow, a) for a in ("early", "late")}
    assert (rows["early"].state, rows["early"].node_id) == ("planning", best)
    assert (rows["late"].state, rows["late"].node_id) == ("planning", found.candidates[0].node)


async def test_a_choice_is_recorded_only_while_its_node_has_room_for_it(sessions, examples_dir) -> None:
    """`record_first_choice` writes nothing when allocations the ranking did not see on the node (`seen`) have taken
    more GPUs there since than the room it saw beyond its own request (`spare`): planned there, or already claimed
    there. What the ranking saw, or what ended, does not count; without `seen` it writes anyway."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    records, env = RecordActivities(sessions), ActivityEnvironment()
    request = PlacementRequest(gpu_count=2, tenant="acme")
    for allocation in ("a", "b", "c"):
        opening = AllocationRecord(allocation_id=allocation, tenant="acme", request=request, workflow_id=allocation)
        await env.run(records.record_trail, AuditTrail(opening=opening))
    node = "j22u05"
    assert (await record_first_choice(sessions, "us-east", "a", node, seen=[])).recorded  # "a" plans 2 GPUs there
    moved = await record_first_choice(sessions, "us-east", "b", node, seen=[], spare=1)
    assert not moved.recorded and moved.waited_ms >= 0 and moved.held_ms >= 0
    async with sessions() as session:
        assert (await session.get(AllocationRow, "b")).node_id is None
    assert (await record_first_choice(sessions, "us-east", "b", node, seen=[], spare=2)).recorded  # room left
    assert (await record_first_choice(sessions, "us-east", "b", node, seen=["a"])).recorded  # seen: not new
    # what the ranking saw that has ended since (released, given up) only left more room
    assert (await record_first_choice(sessions, "us-east", "a", node, seen=["b", "ended"])).recorded
    assert not (await record_first_choice(sessions, "us-east", "a", node, seen=[], spare=1)).recorded

    async with sessions.begin() as session:  # "c" was planned since the read and has claimed a slot already
        slot = await session.scalar(select(SlotRow.id).where(SlotRow.node_id == node, SlotRow.slot_index == 0))
        session.add(ClaimRow(allocation_id="c", attempt=1, slot_id=slot, node_id=node, bundle={}))
    assert not (await record_first_choice(sessions, "us-east", "a", node, seen=["b"], spare=0)).recorded
    assert (await record_first_choice(sessions, "us-east", "a", node, seen=["b"], spare=1)).recorded
    assert (await record_first_choice(sessions, "us-east", "a", node, seen=None)).recorded
    async with sessions() as session:
        rows = {a: await session.get(AllocationRow, a) for a in ("a", "b")}
    assert [(r.state, r.node_id) for r in rows.values()] == [("planning", node)] * 2
