"""What an allocation costs in Temporal actions, counted from its history as Temporal Cloud bills them,
and the UI story and audit trail it keeps while it makes fewer of them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHistory

from bench.actions import Actions, count_actions, run_histories
from store.models import AllocationRow
from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import AllocationStatus
from workflows.search_attributes import NODE, REGION, STATE


async def test_happy_path_reaches_active_in_at_most_8_actions(temporal_client, sessions, tmp_path: Path) -> None:
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"one": {"gpus": 2}})
    ) as lab:
        handle = await lab.allocate("lean-1", gpus=2)
        await lab.wait_for_state(handle, "active")
        await allocation_client.release(temporal_client, "lean-1")
        assert (await handle.result()).state == "released"
        (run,) = await run_histories(temporal_client, handle.id)
        steps = [(step, state) for step, state, _node, _reason in await lab.events("lean-1")]

    actions = count_actions([run])
    # 8 to `active` (no patch marker, so no `TemporalChangeVersion`): the run that places the allocation holds it
    # too, so no continue-as-new (a run start) is paid at `active`, it starts in `placing`, so the decision
    # needs no upsert of its own, and the lab's hosts make VMs ready the moment they exist, so the create's own
    # first look finds it ready and no `wait_ready` step runs.
    assert Actions.count(actions.to_active) <= 8, actions.to_active
    # 14 through release: the row says `releasing` (one local activity) before the host's teardown,
    # and the final state rides with the release of the claims instead of a write of its own.
    assert Actions.count(actions.total) <= 14, actions.total
    assert actions.total["patch_marker"] == 0

    # What the UI's filters saw, in order: `placing` from the start, then the region with `provisioning`.
    started = run.events[0].workflow_execution_started_event_attributes.search_attributes.indexed_fields
    upserts = [
        {
            name: payload.data.decode().strip('"')
            for name, payload in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields.items()
        }
        for e in run.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    assert started[STATE.name].data.decode() == '"placing"'
    assert upserts == [
        {STATE.name: "provisioning", REGION.name: "lab", NODE.name: "one"},
        {STATE.name: "active"},
        {STATE.name: "releasing"},
        {STATE.name: "released"},
    ]

    # Only the node's own steps cross a task queue; the control steps ran on the workflow's worker.
    assert _scheduled(run) == ["plan_bundles", "create_vm", "destroy_vm"]
    # The readiness look is in the history all the same: the create's answer carries its report.
    created = json.loads(_answer(run, "create_vm"))
    assert created["readiness"]["ssh"] and created["readiness"]["cloud_init"] and created["readiness"]["nvidia_smi"]
    assert len(run.events) < 80, len(run.events)
    assert actions.total["timer"] == 0  # a provisioning deadline further away than the create can take: no timer
    # Region and candidates were one step, yet the audit trail tells both decisions.
    assert steps == [
        ("select_region", "placing"),
        ("find_candidates", "placing"),
        ("plan_bundles", "planning"),
        ("record_claims", "claiming"),
        ("create_vm", "provisioning"),
        ("wait_ready", "waiting_ready"),
        ("ready", "active"),
        ("release", "releasing"),
        ("released", "released"),
    ]


def _scheduled(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def _answer(history: WorkflowHistory, activity: str) -> bytes:
    """The result of the named activity's completion in `history` (its first, as the payload's bytes)."""
    names = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    return next(
        e.activity_task_completed_event_attributes.result.payloads[0].data
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and names[e.activity_task_completed_event_attributes.scheduled_event_id] == activity
    )


async def test_a_slow_boot_shows_waiting_ready_in_the_ui_and_the_audit_trail(
    temporal_client, sessions, tmp_path: Path
) -> None:
    hosts = {"slow": {"gpus": 2, "simulation": {"bootSeconds": 3600}}}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts)) as lab:
        handle = await lab.allocate("lean-slow", gpus=2)
        await lab.wait_for_state(handle, "waiting_ready")
        for _ in range(100):  # the first readiness report says "not yet": the UI and the row follow
            attributes = (await handle.describe()).typed_search_attributes
            async with sessions() as session:
                row = await session.scalar(select(AllocationRow).where(AllocationRow.id == "lean-slow"))
            if attributes.get(STATE) == "waiting_ready" and row is not None and row.state == "waiting_ready":
                break
            await asyncio.sleep(0.1)
        assert (attributes.get(STATE), attributes.get(REGION), attributes.get(NODE)) == ("waiting_ready", "lab", "slow")
        assert row is not None and (row.state, row.node_id) == ("waiting_ready", "slow")
        status = await handle.query("status_query", result_type=AllocationStatus)
        assert [(a.node, a.outcome) for a in status.attempts] == [("slow", "running")]
        history = await handle.fetch_history()
        # A host whose guests boot takes no look in the create: the wait is the `wait_ready` step's, as ever.
        assert json.loads(_answer(history, "create_vm"))["readiness"] is None
        assert _scheduled(history)[-1] == "wait_ready"
        await handle.cancel()
        await asyncio.gather(handle.result(), return_exceptions=True)
        assert await lab.active_claims() == {}


async def test_a_refused_request_costs_one_local_activity_and_one_upsert(temporal_client, sessions, tmp_path) -> None:
    """A request the fleet cannot hold now is refused by the first control step, which records the refusal itself:
    the UI goes from `placing` (set by the start) to `failed` with nothing in between, and the audit trail still
    tells both decisions."""
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"one": {"gpus": 2}})
    ) as lab:
        holder = await lab.allocate("holder", gpus=2)
        await lab.wait_for_state(holder, "active")
        refused = await lab.allocate("refused", gpus=2)
        with pytest.raises(WorkflowFailureError) as failure:
            await refused.result()
        status = await refused.query("status_query", result_type=AllocationStatus)
        attributes = (await refused.describe()).typed_search_attributes
        history = await refused.fetch_history()
        steps = await lab.events("refused")
        async with sessions() as session:
            row = await session.scalar(select(AllocationRow).where(AllocationRow.id == "refused"))
        await allocation_client.release(temporal_client, "holder")
        await holder.result()

    reason = status.failure_reason or ""
    assert reason.startswith("insufficient_capacity: ") and failure.value.cause.message == reason  # type: ignore[attr-defined]
    assert (status.state, attributes.get(STATE), attributes.get(REGION)) == ("failed", "failed", "lab")
    assert row is not None and (row.state, row.failure_reason) == ("failed", reason)
    assert steps == [
        ("select_region", "placing", None, None),
        ("find_candidates", "placing", None, None),
        ("failed", "failed", None, reason),
    ]
    actions = count_actions([history])
    assert dict(actions.total) == {"start": 1, "local_activity": 1, "upsert": 1}
    assert len(history.events) == 7  # started, one workflow task, the step's marker, the upsert, failed
