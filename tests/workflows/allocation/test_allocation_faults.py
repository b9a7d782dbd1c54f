"""Faults the allocation saga must survive: each against real Temporal, real PostgreSQL and real node-agent
workers whose hosts are simulated. In every case the allocation ends somewhere a user understands, and nothing of a
failed attempt is left on the node it tried."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from contracts.allocation import PlanInput, PlanOutcome
from store.models import AllocationRow, ClaimRow, NodeAgentRow, SlotRow
from tests.ledger import billed
from tests.workflows.lab import FAST, lab_fleet, running_lab
from workflows.allocation import client as allocation_client


# Best fit ranks a 2-GPU request onto `first` (2 GPUs), then `second` (3), then `third` (4).
def hosts(**first_simulation: object) -> dict:
    return {"first": {"gpus": 2, "simulation": dict(first_simulation)}, "second": {"gpus": 3}, "third": {"gpus": 4}}


async def _placed_after_failure(lab, allocation_id: str, reason: str, *, claimed: bool = False) -> None:
    handle = await lab.allocate(allocation_id, gpus=2)
    status = await lab.wait_for_state(handle, "active", timeout=60)
    assert status.node == "second"
    assert [(a.node, a.outcome) for a in status.attempts] == [("first", "failed"), ("second", "succeeded")]
    assert status.attempts[0].reason.startswith(reason), status.attempts[0].reason
    assert await lab.active_claims() == {allocation_id: ["second/0", "second/1"]}
    states = await lab.slot_states()
    assert states["first/0"] == states["first/1"] == "available"
    assert [p.name for p in lab.vm_records()] == [f"{allocation_id}.json"]
    assert "first" not in str(lab.vm_records())
    assert lab.lease_files() == []
    events = await lab.events(allocation_id)
    assert ("attempt_failed", "placing", "first") == events[[e[0] for e in events].index("attempt_failed")][:3]
    # The usage ledger: a failure after the claim bills the first attempt until its undo released the claims;
    # one before the claim bills nothing. The second attempt is held.
    first = [(1, 2, "attempt_failed")] if claimed else []
    assert await billed(lab.sessions, allocation_id) == [*first, (2, 2, None)]


async def test_a_node_whose_agent_never_reported_is_not_tried(temporal_client, sessions, tmp_path: Path) -> None:
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts()), agents=["second", "third"]
    ) as lab:
        handle = await lab.allocate("never-1", gpus=2)
        status = await lab.wait_for_state(handle, "active", timeout=30)
        assert [(a.node, a.outcome) for a in status.attempts] == [("second", "succeeded")]


async def test_an_agent_that_dies_costs_one_pickup_timeout_then_is_skipped(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """The agent reported (live) and then died: the first allocation pays the pickup timeout and falls through,
    which marks the node down at once, so the next allocation does not try it at all."""
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts())) as lab:
        await lab.stop_agent("first")
        await _placed_after_failure(lab, "down-1", "agent_unreachable")
        async with sessions() as session:
            agent = await session.get(NodeAgentRow, "first")
        assert agent is not None and agent.state == "down" and agent.down_reason.startswith("agent_unreachable")
        handle = await lab.allocate("down-2", gpus=1)
        status = await lab.wait_for_state(handle, "active", timeout=30)
        assert [a.node for a in status.attempts] == ["second"]
        await lab.start_agent("first")  # back: its start report makes it live again
        handle = await lab.allocate("down-3", gpus=2)
        status = await lab.wait_for_state(handle, "active", timeout=30)
        assert [(a.node, a.outcome) for a in status.attempts] == [("first", "succeeded")]


async def test_plan_refused_by_a_changed_host_moves_on(temporal_client, sessions, tmp_path: Path) -> None:
    """The host lost its VFs after its agent's start report: the control plane still ranks it first, the agent's own
    validation refuses the plan, and the allocation moves on."""
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts(refusePlans=True))
    ) as lab:
        await _placed_after_failure(lab, "refused-1", "slots_invalid")


async def test_a_failed_readiness_gate_is_named_and_moves_on(temporal_client, sessions, tmp_path: Path) -> None:
    """cloud-init reported an error on the first node: the attempt fails at once (no waiting out the readiness
    timeout) with the gate's name and message, is compensated, and the next node takes the allocation."""
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts(cloudInitFails=True))
    ) as lab:
        await _placed_after_failure(
            lab, "gate-1", "readiness_failed: cloud_init: simulated fault: cloud-init", claimed=True
        )


async def test_vm_create_failure_is_compensated(temporal_client, sessions, tmp_path: Path) -> None:
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts(failCreate=True))
    ) as lab:
        await _placed_after_failure(lab, "create-1", "vm_create_failed", claimed=True)


async def test_claim_conflict_releases_the_lease_and_moves_on(temporal_client, sessions, tmp_path: Path) -> None:
    """Another allocation claims the planned slots between the node's plan and our claim."""
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts()), agents=["second", "third"]
    ) as lab:
        agent = lab.agent("first")

        @activity.defn(name="plan_bundles")
        def plan_then_lose_the_race(request: PlanInput) -> PlanOutcome:
            outcome = agent.plan(request)
            import asyncio

            asyncio.run(_steal(lab, outcome))
            return outcome

        await lab.start_agent("first", [plan_then_lose_the_race, *agent.activities()[1:]])
        await _placed_after_failure_with_thief(lab)


async def test_a_plan_whose_answer_is_lost_leaves_no_lease_on_its_node(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """The node leased the slots but its answer never reached the workflow (in production: the plan's deadline
    passed while the agent was still planning). The attempt fails over to the next node, and its undo gives the
    lease on `first` back at once rather than leaving it there until it expires."""
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts()), agents=["second", "third"]
    ) as lab:
        agent = lab.agent("first")

        @activity.defn(name="plan_bundles")
        def plan_then_lose_the_answer(request: PlanInput) -> PlanOutcome:
            agent.plan(request)  # the lease is written on the host
            raise ApplicationError("the plan's answer was lost", type="AnswerLost", non_retryable=True)

        await lab.start_agent("first", [plan_then_lose_the_answer, *agent.activities()[1:]])
        await _placed_after_failure(lab, "lost-answer", "")


async def _steal(lab, outcome: PlanOutcome) -> None:
    from store.db import create_engine, session_factory

    engine = create_engine(str(lab.sessions.kw["bind"].url.render_as_string(hide_password=False)), pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            session.add(
                AllocationRow(
                    id="thief",
                    tenant="acme",
                    state="active",
                    shape="gpu_slice",
                    gpu_count=2,
                    request={},
                    workflow_id="allocation/thief",
                )
            )
            await session.flush()
            for index in outcome.slot_indexes:
                slot = (
                    await session.scalars(
                        select(SlotRow).where(SlotRow.node_id == "first", SlotRow.slot_index == index)
                    )
                ).one()
                slot.state = "reserved"
                session.add(ClaimRow(allocation_id="thief", attempt=1, slot_id=slot.id, node_id="first", bundle={}))
    finally:
        await engine.dispose()


async def _placed_after_failure_with_thief(lab) -> None:
    handle = await lab.allocate("racer", gpus=2)
    status = await lab.wait_for_state(handle, "active", timeout=60)
    assert [(a.node, a.outcome) for a in status.attempts] == [("first", "failed"), ("second", "succeeded")]
    assert status.attempts[0].reason.startswith("claim_conflict")
    assert await lab.active_claims() == {"thief": ["first/0", "first/1"], "racer": ["second/0", "second/1"]}
    assert lab.lease_files() == []
    assert await lab.double_claims() == 0
    # The audit trail keeps the refused attempt: its steps were written before the claim was refused.
    steps = [(step, state, node) for step, state, node, _reason in await lab.events("racer")]
    assert ("record_claims", "claiming", "first") in steps
    assert steps.index(("record_claims", "claiming", "first")) < steps.index(("attempt_failed", "placing", "first"))
    assert steps[-1] == ("ready", "active", "second")


async def test_readiness_that_never_comes_times_out_and_moves_on(
    temporal_env, temporal_client, sessions, tmp_path
) -> None:
    """A 10-minute readiness timeout, skipped in virtual time."""
    timing = FAST.model_copy(update={"readiness_timeout_seconds": 600.0, "readiness_poll_seconds": 150.0})
    async with running_lab(
        temporal_env.client, temporal_client, sessions, tmp_path, lab_fleet(hosts(neverReady=True))
    ) as lab:
        handle = await lab.allocate("slow-1", gpus=2, timing=timing)
        status = await lab.wait_for_state(handle, "active", timeout=90)
        assert [(a.node, a.outcome) for a in status.attempts] == [("first", "failed"), ("second", "succeeded")]
        assert status.attempts[0].reason == (
            "readiness_timeout: not ready after 600s: waiting for cloud_init, gpus (simulated fault: cloud-init hangs)"
        )
        assert (await lab.slot_states())["first/0"] == "available"
        assert [p.name for p in lab.vm_records()] == ["slow-1.json"]
        await allocation_client.release(temporal_client, "slow-1")
        await handle.result()


async def test_every_candidate_failing_ends_in_sku_unavailable(temporal_client, sessions, tmp_path: Path) -> None:
    broken = {name: {"gpus": 4, "simulation": {"failCreate": True}} for name in ("x1", "x2", "x3")}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(broken)) as lab:
        handle = await lab.allocate("doomed", gpus=2)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        cause = failure.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "SkuUnavailable" and cause.non_retryable
        for node in ("x1", "x2", "x3"):
            assert f"{node}: vm_create_failed: simulated fault: VM creation fails on {node}" in cause.message
        async with sessions() as session:
            row = await session.get(AllocationRow, "doomed")
        assert row.state == "failed" and row.failure_reason.startswith(
            "sku_unavailable: 2 GPU slices could not be placed"
        )
        assert await lab.active_claims() == {} and lab.vm_records() == [] and lab.lease_files() == []
        assert set((await lab.slot_states()).values()) == {"available"}


async def test_cancel_while_provisioning_compensates_everything(temporal_client, sessions, tmp_path: Path) -> None:
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts(bootSeconds=3600))
    ) as lab:
        handle = await lab.allocate("cancel-1", gpus=2)
        await lab.wait_for_state(handle, "waiting_ready")
        assert [p.name for p in lab.vm_records()] == ["cancel-1.json"]
        await allocation_client.cancel(temporal_client, "cancel-1")
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
        assert lab.vm_records() == [] and lab.lease_files() == []
        assert await lab.active_claims() == {}
        assert set((await lab.slot_states()).values()) == {"available"}
        async with sessions() as session:
            assert (await session.get(AllocationRow, "cancel-1")).state == "cancelled"
        wipes = (tmp_path / "nodes" / "first" / "wipes.log").read_text()
        assert '"slots": [0, 1]' in wipes


async def test_operator_retry_mid_flight_moves_elsewhere_and_cleans_the_first_node(
    temporal_client, sessions, tmp_path: Path
) -> None:
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts(bootSeconds=3600))
    ) as lab:
        handle = await lab.allocate("retry-1", gpus=2)
        await lab.wait_for_state(handle, "waiting_ready")
        accepted = await allocation_client.retry(temporal_client, "retry-1", ["first"])
        assert accepted.abandoned_node == "first" and accepted.excluded_nodes == ["first"]
        status = await lab.wait_for_state(handle, "active")
        assert status.node == "second"
        assert [(a.node, a.outcome, a.reason) for a in status.attempts][0] == (
            "first",
            "abandoned",
            "operator_retry: abandoned by an operator's retry",
        )
        assert await lab.active_claims() == {"retry-1": ["second/0", "second/1"]}
        assert [p.name for p in lab.vm_records()] == ["retry-1.json"]
        assert not (tmp_path / "nodes" / "first" / "vms" / "retry-1.json").exists()
        assert (await lab.slot_states())["first/0"] == "available"
        assert lab.lease_files() == []


async def test_a_failed_allocation_can_be_retried_as_a_new_run(temporal_client, sessions, tmp_path: Path) -> None:
    broken = {"only": {"gpus": 4, "simulation": {"failCreate": True}}}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(broken)) as lab:
        first = await lab.allocate("again", gpus=2)
        with pytest.raises(WorkflowFailureError):
            await first.result()
        second = await allocation_client.restart_failed(temporal_client, lab.input_for("again"))
        assert second.result_run_id != first.result_run_id
        with pytest.raises(WorkflowFailureError):
            await second.result()
        events = await lab.events("again")
        assert [e[0] for e in events].count("select_region") == 2  # both runs are in the audit trail


async def test_a_wipe_that_fails_quarantines_the_slots_with_its_reason(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """Released on a host whose NVMe format fails: the allocation is released, and its slots are quarantined with
    the wipe's reason (never back in the pool) until a wipe succeeds."""
    fleet = lab_fleet({"only": {"gpus": 2, "simulation": {"wipeFails": True}}})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        handle = await lab.allocate("wipe-1", gpus=2)
        await lab.wait_for_state(handle, "active", timeout=30)
        await allocation_client.release(temporal_client, "wipe-1")
        await lab.wait_for_state(handle, "released", timeout=60)
        async with sessions() as session:
            rows = (await session.execute(select(SlotRow.state, SlotRow.quarantine_reason))).all()
        assert [state for state, _ in rows] == ["quarantined", "quarantined"]
        assert all("wipe_failed: slot" in (reason or "") and "format failed" in (reason or "") for _, reason in rows), (
            rows
        )
        assert await lab.active_claims() == {}


async def test_a_release_waiting_for_its_host_says_releasing_not_active(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """Released while its host's agent is away: the host's teardown waits for the agent (up to the pickup timeout,
    two minutes here), and meanwhile the row (what the API, the CLI and a platform team's own queries read) says
    `releasing`, never `active`, while the VM is still there. Once the agent is back the VM goes, the slots are
    wiped and free, and the allocation ends `released`."""
    patient = FAST.model_copy(update={"agent_pickup_seconds": 120.0})
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"only": {"gpus": 2}})
    ) as lab:
        handle = await lab.allocate("release-waits", gpus=2, timing=patient)
        await lab.wait_for_state(handle, "active", timeout=30)
        await lab.stop_agent("only")
        await allocation_client.release(temporal_client, "release-waits")
        for _ in range(200):
            async with sessions() as session:
                state = await session.scalar(select(AllocationRow.state).where(AllocationRow.id == "release-waits"))
            if state != "active":
                break
            await asyncio.sleep(0.05)
        assert state == "releasing"
        assert [path.stem for path in lab.vm_records()] == ["release-waits"]  # the host has not torn it down yet
        await lab.start_agent("only")
        assert (await handle.result()).state == "released"
        assert lab.vm_records() == [] and set((await lab.slot_states()).values()) == {"available"}
        assert await lab.active_claims() == {}
