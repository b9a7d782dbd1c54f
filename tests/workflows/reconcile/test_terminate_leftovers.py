"""What a terminate leaves behind, and the reconciler cleaning it up.

An operator with the Temporal UI can terminate an allocation's workflow. Terminate is not cancel: the workflow gets
no chance to run its compensation, so whatever it held stays held. Two allocations are terminated here, against a
real PostgreSQL, a real Temporal server and real node-agent workers (simulated hosts):

    `running`  active on n1: its VM, its claims, its slots reserved
    `placing`  terminated in `provisioning` on n2, while its VM create is under way on the agent (held there by a
               gate, so the moment is reached deterministically; the create then fails without making a VM, as a
               create cut short does): its lease, its claims, its slots reserved

Then the reconciler runs as `berth audit --repair` runs it (`run_now`, the same `Reconcile` workflow the schedule and
`POST /v1/audit` start) until nothing is left: every leftover is found by kind and repaired, the slots are available
again, no claim is active, no VM or live lease is left, and each allocation's row is final (`failed`, with a reason
that says its workflow ended without finishing).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryRejectedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from contracts.allocation import PLACING_STATES, VmInfo, VmSpec
from store.models import AllocationRow
from tests.workflows.lab import Lab, lab_fleet, running_lab
from tests.workflows.reconcile.test_reconcile import audit, found
from workflows.allocation import client as allocation_client
from workflows.reconcile.workflow import ReconcileWorkflow

HOSTS = {"n1": {"gpus": 4}, "n2": {"gpus": 4}}
OPERATOR = "terminated by an operator in the Temporal UI"


class CreateGate:
    """A `create_vm` that signals it started, then waits to be let go and fails without creating anything (the
    agent died mid-create). It heartbeats while it waits, as a live agent does."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.left = threading.Event()

    def activity(self) -> object:
        @activity.defn(name="create_vm")
        def create_vm(spec: VmSpec) -> VmInfo:
            self.entered.set()
            try:
                while not self.release.wait(0.5):
                    activity.heartbeat("creating")
                raise ApplicationError(f"the agent stopped before creating the VM of {spec.allocation_id}")
            finally:
                self.left.set()

        return create_vm


def agent_with(lab: Lab, node: str, create_vm: object) -> list[object]:
    activities = lab.agent(node).activities()
    return [create_vm if getattr(a, "__name__", "") == "create_vm" else a for a in activities]


async def rows(lab: Lab) -> dict[str, tuple[str, str | None]]:
    async with lab.sessions() as session:
        result = await session.execute(select(AllocationRow.id, AllocationRow.state, AllocationRow.failure_reason))
        return {allocation: (state, reason) for allocation, state, reason in result}


async def test_the_reconciler_repairs_everything_a_terminate_leaves(
    temporal_client: Client, sessions, tmp_path: Path
) -> None:
    gate = CreateGate()
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(HOSTS), agents=["n1"]
    ) as lab:
        await lab.start_agent("n2", activities=agent_with(lab, "n2", gate.activity()))
        running = await lab.allocate("running", gpus=2, nodes=frozenset({"n1"}))
        await lab.wait_for_state(running, "active")
        placing = await lab.allocate("placing", gpus=2, nodes=frozenset({"n2"}))
        assert await asyncio.to_thread(gate.entered.wait, 30), "the VM create never started"
        await lab.wait_for_state(placing, "provisioning")

        for handle in (running, placing):
            await handle.terminate(reason=OPERATOR)
            assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
            # A closed run no longer speaks for the allocation (it would say `active`): the API reads the row.
            with pytest.raises(WorkflowQueryRejectedError):
                await allocation_client.status(temporal_client, handle.id.removeprefix("allocation/"))
        gate.release.set()
        assert await asyncio.to_thread(gate.left.wait, 30)

        # What the terminate left: compensation never ran.
        assert sorted(p.name for p in lab.vm_records()) == ["running.json"]
        assert [p.name for p in lab.lease_files()] == ["placing.json"]
        claims = await lab.active_claims()
        assert sorted(claims) == ["placing", "running"]
        states = await lab.slot_states()
        assert sorted(slot for slot, state in states.items() if state != "available") == sorted(
            claims["placing"] + claims["running"]
        )
        before = {allocation: state for allocation, (state, _reason) in (await rows(lab)).items()}
        assert before["running"] == "active" and before["placing"] in PLACING_STATES  # the last step it recorded
        n1 = sorted(int(slot.split("/")[1]) for slot in claims["running"])
        n2 = sorted(int(slot.split("/")[1]) for slot in claims["placing"])

        first = await audit(lab, temporal_client, repair=True)
        assert found(first) == [
            ("abandoned_allocation", None, "placing", []),
            ("abandoned_allocation", None, "running", []),
            ("orphan_lease", "n2", "placing", n2),
            ("stale_claim", "n1", "running", n1),
            ("stale_claim", "n2", "placing", n2),
        ]
        vm_claim = next(f for f in first.findings if f.kind.value == "stale_claim" and f.node == "n1")
        assert vm_claim.blocked is not None and vm_claim.blocked.startswith("grace period")  # its VM: next audit
        assert sorted((r.kind.value, r.allocation_id, r.outcome) for r in first.repairs) == [
            ("abandoned_allocation", "placing", "done"),
            ("abandoned_allocation", "running", "done"),
            ("orphan_lease", "placing", "done"),
            ("stale_claim", "placing", "done"),
        ]

        second = await audit(lab, temporal_client, repair=True)
        assert found(second) == [("stale_claim", "n1", "running", n1)]
        assert [(r.kind.value, r.allocation_id, r.outcome) for r in second.repairs] == [
            ("stale_claim", "running", "done")
        ]

        # Nothing is left, and the rows say what happened.
        assert found(await audit(lab, temporal_client)) == []
        assert lab.vm_records() == [] and lab.lease_files() == []
        assert await lab.active_claims() == {}
        assert set((await lab.slot_states()).values()) == {"available"}
        final = await rows(lab)
        assert {allocation: state for allocation, (state, _reason) in final.items()} == {
            "running": "failed",
            "placing": "failed",
        }
        for allocation, (_state, reason) in final.items():
            assert (reason or "").startswith("workflow_terminated: "), reason
            assert f"while {before[allocation]}" in (reason or ""), reason
        events = await lab.events("placing")
        assert ("reconciler_close_allocation", "failed") in [(step, state) for step, state, *_ in events]
        assert (await lab.actors("placing"))["reconciler_close_allocation"] == "berth:reconciler"
        history = await temporal_client.get_workflow_handle(first.workflow_id or "").fetch_history()
    await Replayer(workflows=[ReconcileWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)
