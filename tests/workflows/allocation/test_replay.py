"""Determinism: recorded allocation histories must replay on the current workflow code.

The files in histories/ were recorded from real runs (happy path with release, a fallthrough after a failed
create, a cancellation while provisioning, a refusal, and a request that waited in its queue and was woken; an
allocation with an end, extended, warned and expired, recorded by tests/workflows/allocation/test_leases.py; one preempted, by
tests/workflows/allocation/test_preemption.py; one moved off a failed GPU by its pool, by tests/api/test_gpu_failure_replace.py;
a hold handed over to a fresh run, two runs `_1` and `_2`, by tests/workflows/allocation/test_one_story.py), for the current
revision (unprefixed: one run from placement to release) and for the previous one (`allocation_revision6-*`, whose
lease's undo was registered only after the node's plan answered): the two the code runs
(workflows/allocation/revisions.py). When a revision retires, its files go with its branches (docs/design.md,
"Upgrading the allocation workflow"). `allocation_replay-happy-no-first-look` is a happy path of the current revision
whose host took no readiness look in its create (an agent from before the look, as a booting host's): a
`wait_ready` step follows the create. A change that would break running workflows fails here; it needs a new
revision (or `workflow.patched(...)`). Re-record the current revision's files with BERTH_RECORD_HISTORIES=1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.actions import run_histories
from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import QueueWait
from workflows.allocation.workflow import AllocationWorkflow
from workflows.recovery.workflow import SlotRecoveryWorkflow

HISTORIES = Path(__file__).parent / "histories"


def _replayer() -> Replayer:
    return Replayer(workflows=[AllocationWorkflow, SlotRecoveryWorkflow], data_converter=pydantic_data_converter)


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await _replayer().replay_workflow(history)


async def test_fresh_histories_replay(temporal_client, sessions, tmp_path: Path) -> None:
    hosts = {
        "first": {"gpus": 2, "simulation": {"failCreate": True}},
        "second": {"gpus": 3, "simulation": {"bootSeconds": 3600}},
        "third": {"gpus": 4},
    }
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts)) as lab:
        happy = await lab.allocate("replay-happy", gpus=4, exclude_nodes=frozenset({"second"}))
        await lab.wait_for_state(happy, "active")
        await allocation_client.release(temporal_client, "replay-happy")
        await happy.result()

        fallthrough = await lab.allocate("replay-cancel", gpus=2)
        await lab.wait_for_state(fallthrough, "waiting_ready")
        await fallthrough.cancel()
        with pytest.raises(Exception):  # noqa: B017 - the run ends cancelled
            await fallthrough.result()

        # Refusals, decided by the first control step: the cluster level (no room now: `second` boots forever,
        # `third` holds the happy run's successor) and the region level (the tenant's quota).
        holder = await lab.allocate("replay-holder", gpus=4)
        await lab.wait_for_state(holder, "active")
        refused = await lab.allocate("replay-refused", gpus=4)
        with pytest.raises(Exception):  # noqa: B017 - the run ends failed: insufficient capacity
            await refused.result()
        # A request that may wait: queued behind the holder, woken by its release, placed, then released.
        waiting = await lab.allocate("replay-queued", gpus=4, queue=QueueWait(timeout_seconds=600))
        await lab.wait_for_state(waiting, "queued")
        await allocation_client.release(temporal_client, "replay-holder")
        await holder.result()
        await lab.wait_for_state(waiting, "active")
        await allocation_client.release(temporal_client, "replay-queued")
        await waiting.result()

        handles = (happy, fallthrough, refused, waiting)
        runs = {handle.id: await run_histories(temporal_client, handle.id) for handle in handles}
    # Each is one run: the released allocations were placed and held in the same run.
    assert [len(runs[handle.id]) for handle in handles] == [1, 1, 1, 1]
    for histories in runs.values():
        for history in histories:
            await _replayer().replay_workflow(history)
    if os.environ.get("BERTH_RECORD_HISTORIES"):
        for workflow_id, histories in runs.items():
            for number, history in enumerate(histories, start=1):
                name = workflow_id.replace("/", "_") + (f"_{number}" if len(histories) > 1 else "")
                (HISTORIES / f"{name}.json").write_text(history.to_json())
