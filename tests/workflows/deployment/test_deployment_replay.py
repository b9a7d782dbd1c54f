"""Determinism of the deployment and replica workflows: histories recorded from real runs must replay on the
current code.

The files in histories/ here were recorded before deployments were namespaced (a default-namespace
deployment of two replicas, scaled to one, then deleted), so a change to the commands these workflows issue for a
default-namespace deployment, which would break the ones running now, fails here. Re-record with
BERTH_RECORD_HISTORIES=1 only after an intended change guarded by `workflow.patched(...)`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflows.deployment_lab import deployment, deployment_lab, k8s_fleet
from workflows.deployment import client as deployment_client
from workflows.deployment.replica import ReplicaWorkflow
from workflows.deployment.workflow import DeploymentWorkflow

HISTORIES = Path(__file__).parent / "histories"


def _replayer() -> Replayer:
    return Replayer(workflows=[DeploymentWorkflow, ReplicaWorkflow], data_converter=pydantic_data_converter)


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_recorded_deployment_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await _replayer().replay_workflow(history)


async def test_fresh_deployment_histories_replay(temporal_client, sessions, tmp_path: Path) -> None:
    """A run on the current code replays on it (a workflow that is not deterministic fails here); with
    BERTH_RECORD_HISTORIES=1 its histories become the recorded ones."""
    async with deployment_lab(temporal_client, sessions, tmp_path, k8s_fleet({"east": 2})) as lab:
        await lab.apply(deployment("recorded", 2))
        await lab.settled("recorded", 2)
        await lab.apply(deployment("recorded", 1))
        await lab.settled("recorded", 1)
        await deployment_client.delete(temporal_client, "recorded")
        await lab.handle("recorded").result()
        histories = [
            await lab.handle("recorded").fetch_history(),
            await temporal_client.get_workflow_handle("replica/recorded/east/0").fetch_history(),
            await temporal_client.get_workflow_handle("replica/recorded/east/1").fetch_history(),
        ]
    for history in histories:
        await _replayer().replay_workflow(history)
        if os.environ.get("BERTH_RECORD_HISTORIES"):
            (HISTORIES / f"{history.workflow_id.replace('/', '_')}.json").write_text(history.to_json())
