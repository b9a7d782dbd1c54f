"""A pool that replaces allocations off failed GPUs (`onGpuFailure: Replace`), end to end through the API:
the node's agent (simulated host, its real report loop) reports a GPU gone from the bus; the allocation holding it
is told (`degraded`, with the reason), its VM on that node is destroyed and its slots wiped and freed, and it is
placed again on a healthy node, keeping the end it had; the failed slot stays out of placement."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from agent.reporter import NodeReporter
from bench.actions import run_histories
from tests.api.stack import Stack, running_stack
from tests.api.test_gpu_health_api import ApiSink, _fail_gpu, _node
from tests.ledger import billed
from tests.workflows.allocation.test_replay import HISTORIES
from tests.workflows.lab import lab_fleet
from workflows.allocation.workflow import AllocationWorkflow


async def _active_on(stack: Stack, allocation_id: str, node: str, timeout: float = 60) -> dict[str, Any]:
    """Poll as a client would until the allocation is active again on `node`, and its trail says so (the live
    state may come from the workflow a moment before its events are written)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        allocation = await stack.get(allocation_id)
        last = allocation["events"][-1] if allocation["events"] else {}
        if allocation["state"] == "active" and allocation["node"] == node and last.get("node") == node:
            return allocation
        assert asyncio.get_running_loop().time() < deadline, f"not active on {node}: {allocation}"
        await asyncio.sleep(0.1)


@pytest.fixture
async def replacing(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> AsyncIterator[Stack]:
    fleet = lab_fleet({"left": {"gpus": 2}, "right": {"gpus": 2}}, slices={"onGpuFailure": "Replace"})
    async with running_stack(temporal_client, sessions, tmp_path, fleet) as stack:
        yield stack


async def test_an_allocation_whose_gpu_fails_moves_to_a_healthy_node_keeping_its_end(replacing: Stack) -> None:
    stack = replacing
    held = await stack.create(2, duration="2h")
    first = await stack.wait_for(held, "active")
    sick_node = first["node"]
    other = "right" if sick_node == "left" else "left"
    reporter = NodeReporter(stack.lab.agent(sick_node), ApiSink(stack, await stack.lab.node_token(sick_node)))
    await reporter.report_once()

    gpu = next(b["gpu_pci"] for b in first["bundles"] if b["slot_id"] == f"{sick_node}/0")
    _fail_gpu(stack, sick_node, 0, gpu)
    await reporter.report_once()

    moved = await _active_on(stack, held, other)
    assert datetime.fromisoformat(moved["ends_at"]) == datetime.fromisoformat(first["ends_at"])
    steps = [(e["step"], e["state"]) for e in moved["events"]]
    assert ("gpu_failed", "degraded") in steps, str(steps)
    told = steps.index(("gpu_failed", "degraded"))
    assert steps[told + 1 : told + 3] == [("attempt_failed", "placing"), ("replace", "placing")], str(steps)
    assert steps[-1] == ("ready", "active")
    event = next(e for e in moved["events"] if e["step"] == "gpu_failed")
    assert event["reason"] == (
        f"the GPU of slot {sick_node}/0 failed (the GPU {gpu} is gone from the PCI bus); its "
        "pool moves it to a healthy node"
    )
    # The replacement's two attempts are the last: the sick node's, failed with the GPU's reason, then the healthy
    # node's. (The first placement may have needed more than one try on a loaded machine: its failures come first.)
    *_, old, new = moved["attempts"]
    assert (old["node"], old["outcome"]) == (sick_node, "failed"), moved["attempts"]
    assert old["reason"] == f"the GPU of slot {sick_node}/0 failed: the GPU {gpu} is gone from the PCI bus"
    assert (new["node"], new["outcome"]) == (other, "succeeded"), moved["attempts"]

    # Nothing left behind on the sick node: one VM (the new one), claims only on the healthy node; the failed slot
    # is out of placement, its healthy neighbour free again.
    assert [p.parent.parent.name for p in stack.lab.vm_records()] == [other]
    assert sorted((await stack.lab.active_claims())[held]) == [f"{other}/0", f"{other}/1"]
    states = await stack.lab.slot_states()
    assert states[f"{sick_node}/1"] == "available"
    assert [s["index"] for s in (await _node(stack, sick_node))["unhealthy"]] == [0]
    refused = await stack.wait_for(await stack.create(2), "failed")
    assert "unhealthy GPUs" in refused["failure_reason"]

    assert (await stack.http.delete(f"/v1/allocations/{held}", headers=stack.acme)).status_code == 202
    released = await stack.wait_for(held, "released")
    assert stack.lab.vm_records() == []
    # Over, its attempts are read from the trail alone (as when the workflow does not answer its query): the
    # replaced one reads failed, with the GPU's reason, not cut short.
    assert {"number": old["number"], "node": sick_node, "outcome": "failed", "reason": old["reason"]} in released[
        "attempts"
    ], released["attempts"]
    # Billed: the sick node's attempt until it was moved off (`replaced`), the healthy node's until the release.
    assert (await billed(stack.lab.sessions, held))[-2:] == [
        (old["number"], 2, "replaced"),
        (new["number"], 2, "released"),
    ]

    # One run: placed, held, moved off the failed GPU and held again, so its page tells the whole story. It replays
    # on this code; BERTH_RECORD_HISTORIES=1 keeps it for tests/workflows/allocation/test_replay.py.
    client = stack.lab.starter
    histories = await run_histories(client, f"allocation/{held}")
    assert len(histories) == 1
    for history in histories:
        await Replayer(workflows=[AllocationWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)
    if os.environ.get("BERTH_RECORD_HISTORIES"):
        (HISTORIES / "allocation_gpu_replaced.json").write_text(histories[0].to_json())
