"""The node gateway killed and restarted while a node activity runs: nothing is lost and nothing is run twice.

The gateway keeps no state but its key, so a replacement started with the same key accepts the answer to a task the
old one handed out (the chaos suite kills `berth gateway` with SIGKILL under load; this is the same in miniature,
deterministic: the create is in progress on the agent when the gateway goes away)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.client import WorkflowHandle

from tests.workflows.lab import lab_fleet, running_lab


async def _running(handle: WorkflowHandle, activity: str) -> None:
    while True:
        pending = (await handle.describe()).raw_description.pending_activities
        if any(p.activity_type.name == activity for p in pending):
            return
        await asyncio.sleep(0.05)


async def test_a_gateway_restarted_mid_create_loses_nothing_and_runs_nothing_twice(
    temporal_env, temporal_client, sessions, tmp_path: Path
) -> None:
    fleet = lab_fleet({"h1": {"gpus": 2, "simulation": {"createSeconds": 3}}})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        handle = await lab.allocate("through-restart", gpus=1)
        await asyncio.wait_for(_running(handle, "create_vm"), 30)
        await lab.restart_gateway(
            down_seconds=1.0
        )  # the agent's heartbeats and polls fail meanwhile; its create goes on
        status = await lab.wait_for_state(handle, "active", timeout=60)
        assert [(a.node, a.outcome) for a in status.attempts] == [("h1", "succeeded")]
        retried = [
            e.event_id
            for e in (await handle.fetch_history()).events
            if e.HasField("activity_task_started_event_attributes")
            and e.activity_task_started_event_attributes.attempt > 1
        ]
        assert retried == [], f"started again (events {retried}): the answer sealed before the restart was refused"
        assert len(lab.vm_records()) == 1
        await handle.cancel()
        await lab.wait_for_state(handle, "released", "cancelled", timeout=60)
        assert lab.vm_records() == [] and await lab.active_claims() == {}
