"""Durability: processes die in the middle of the saga and nothing is lost, leaked or double-allocated."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select
from temporalio.api.enums.v1 import PendingActivityState, TaskQueueKind, TaskQueueType, TimeoutType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.service import RPCError, RPCStatusCode

from agent.reporter import NodeReporter
from bench.actions import run_histories
from store.models import SlotRow
from tests.workflows.lab import FAST, StoreSink, lab_fleet, running_lab
from workflows.allocation import client as allocation_client

REPO = Path(__file__).resolve().parents[3]


def _control_process(lab, database_url: str, address: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "BERTH_DATABASE_URL": database_url,
        "BERTH_TEMPORAL_ADDRESS": address,
        "BERTH_CONTROL_TASK_QUEUE": lab.queues.control,
        "BERTH_STATE_DIR": str(lab.home),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "worker", "control"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def test_control_worker_killed_mid_saga_then_restarted_completes_without_leaks(
    temporal_client, sessions, database_url: str, tmp_path: Path
) -> None:
    address = temporal_client.service_client.config.target_host
    hosts = {"h1": {"gpus": 4, "simulation": {"bootSeconds": 2}}, "h2": {"gpus": 4, "simulation": {"bootSeconds": 2}}}
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts), control=False
    ) as lab:
        control = _control_process(lab, database_url, address)
        try:
            handle = await lab.allocate(
                "durable-1", gpus=2, timing=FAST.model_copy(update={"readiness_timeout_seconds": 60})
            )
            await lab.wait_for_state(handle, "waiting_ready", timeout=60)
            control.send_signal(signal.SIGKILL)  # no shutdown, no goodbye: the process is simply gone
            control.wait()
            await asyncio.sleep(1.0)
            control = _control_process(lab, database_url, address)
            status = await lab.wait_for_state(handle, "active", timeout=60)
            assert [a.outcome for a in status.attempts] == ["succeeded"]
            assert await lab.active_claims() == {"durable-1": [f"{status.node}/0", f"{status.node}/1"]}
            assert len(lab.vm_records()) == 1 and lab.lease_files() == []
            assert await lab.double_claims() == 0

            await allocation_client.release(temporal_client, "durable-1")
            assert (await handle.result()).state == "released"
            assert await lab.active_claims() == {}
            assert lab.vm_records() == [] and lab.lease_files() == []
        finally:
            control.send_signal(signal.SIGTERM)
            control.wait(timeout=30)


async def _agent_process(lab, node: str) -> subprocess.Popen[bytes]:
    """The node's agent as its own process (`berth worker node`, simulated host, the lab's state and queues), through
    the lab's node gateway with its own token, as on a host: it is given no Temporal address."""
    token_file = lab.home / f"{node}.token"
    token_file.write_text(await lab.node_token(node) + "\n")
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith("BERTH_")},
        "BERTH_NODE_GATEWAY": lab.gateway,
        "BERTH_NODE_TOKEN_FILE": str(token_file),
        "BERTH_NODE_TASK_QUEUE_PREFIX": lab.queues.node_prefix,
        "BERTH_STATE_DIR": str(lab.home),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "worker",
            "node",
            "--node-id",
            node,
            "--topology",
            "simulated",
            "--fleet",
            str(lab.fleet_file),
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def _serving(client, queue: str, agent: subprocess.Popen[bytes]) -> None:
    """Until the agent process polls its queue (a worker's identity is `<pid>@<host>`, which the node gateway passes
    on after the node's name: `h1:<pid>@<host>`)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    for _ in range(600):
        try:
            pollers = (await client.workflow_service.describe_task_queue(request)).pollers
        except RPCError as error:  # the dev server cancels a describe now and then when loaded: ask again
            if error.status is not RPCStatusCode.CANCELLED:
                raise
            pollers = []
        if any(p.identity.split(":", 1)[-1].startswith(f"{agent.pid}@") for p in pollers):
            return
        assert agent.poll() is None, agent.stderr.read().decode() if agent.stderr else "the agent exited"
        await asyncio.sleep(0.1)
    raise AssertionError("the agent process never polled its queue")


async def _started(handle, activity: str) -> None:
    """Until an agent has started `activity` for the workflow (its pending activity is STARTED)."""
    for _ in range(600):
        pending = (await handle.describe()).raw_description.pending_activities
        if any(
            a.activity_type.name == activity and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            for a in pending
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{activity} never started")


async def test_an_agent_killed_mid_create_is_retried_when_it_returns_not_after_the_create_timeout(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """The 277 s a chaos run once saw: an agent killed while it created the VM left the step to its start-to-close timeout
    (5 min), whose retry then found the lease expired. The agent heartbeats every step it runs, so the kill shows
    as a heartbeat timeout within 10 s and the create is retried, on the same node, by the agent that came back."""
    hosts = {"h1": {"gpus": 2, "simulation": {"createSeconds": 5}}}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts), agents=[]) as lab:
        await NodeReporter(lab.agent("h1"), StoreSink(lab.sessions)).report_once()  # live and validated
        agent = await _agent_process(lab, "h1")
        try:
            await _serving(temporal_client, lab.queues.node("h1"), agent)
            handle = await lab.allocate("agent-kill-1", gpus=2)
            await _started(handle, "create_vm")  # on the agent, which takes 5 s over it
            agent.send_signal(signal.SIGKILL)  # mid-create, no goodbye
            agent.wait()
            agent = await _agent_process(lab, "h1")
            await _serving(temporal_client, lab.queues.node("h1"), agent)
            status = await lab.wait_for_state(handle, "active", timeout=90)
            assert [(a.node, a.outcome) for a in status.attempts] == [("h1", "succeeded")]
            creates = [
                e.activity_task_started_event_attributes
                for e in (await run_histories(temporal_client, handle.id))[0].events  # the placement run
                if e.HasField("activity_task_started_event_attributes")
                and e.activity_task_started_event_attributes.attempt > 1
            ]
            assert len(creates) == 1, creates  # the create's one retry, for the reason below
            assert creates[0].last_failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT
            assert await lab.active_claims() == {"agent-kill-1": ["h1/0", "h1/1"]}
            await allocation_client.release(temporal_client, "agent-kill-1")
            assert (await handle.result()).state == "released"
            assert lab.vm_records() == [] and lab.lease_files() == []
        finally:
            agent.send_signal(signal.SIGTERM)
            await asyncio.to_thread(agent.wait, 30)  # the lab's gateway runs in this loop: never block it


async def test_agent_dying_after_vm_create_quarantines_its_slots_until_it_returns(
    temporal_client, sessions, tmp_path: Path
) -> None:
    hosts = {"first": {"gpus": 2, "simulation": {"bootSeconds": 3600}}, "second": {"gpus": 4}}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts)) as lab:
        handle = await lab.allocate("orphan-1", gpus=2)
        await lab.wait_for_state(handle, "waiting_ready")
        await lab.stop_agent("first")  # the host goes dark with a VM on it

        status = await lab.wait_for_state(handle, "active", timeout=60)
        assert status.node == "second"
        assert status.attempts[0].reason.startswith(("agent_unreachable", "agent_timeout"))
        states = await lab.slot_states()
        assert states["first/0"] == states["first/1"] == "quarantined"
        assert await lab.active_claims() == {"orphan-1": ["second/0", "second/1"]}
        async with sessions() as session:
            reason = await session.scalar(select(SlotRow.quarantine_reason).where(SlotRow.node_id == "first"))
        assert reason.startswith("orphan-1: wipe not confirmed")

        # Quarantined slots are never handed out: a request that only fits on `first` is refused.
        refused = await lab.allocate("orphan-2", gpus=2, exclude_nodes=frozenset({"second"}))
        try:
            await refused.result()
        except Exception as error:  # noqa: BLE001 - the failure's text is what a user reads
            assert "insufficient_capacity" in str(error.cause) or "no_compatible" in str(error.cause)
        else:
            raise AssertionError("a quarantined slot was handed out")

        await lab.start_agent("first")  # the host comes back; the recovery workflow's wipe goes through
        for _ in range(100):
            if (await lab.slot_states())["first/0"] == "available":
                break
            await asyncio.sleep(0.1)
        assert (await lab.slot_states())["first/0"] == (await lab.slot_states())["first/1"] == "available"
        assert not (tmp_path / "nodes" / "first" / "vms" / "orphan-1.json").exists()
        assert '"slots": [0, 1]' in (tmp_path / "nodes" / "first" / "wipes.log").read_text()
        await allocation_client.release(temporal_client, "orphan-1")
        await handle.result()
