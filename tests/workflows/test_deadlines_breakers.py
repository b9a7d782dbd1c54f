"""Deadlines and the node breaker, as a user sees them through the API: an allocation that overstays a state
gives everything back and fails naming the state and node; a quota refusal at claim time is a failed attempt with
its reason; a node whose attempts keep failing is not ranked while it cools off, and explain and capacity say so.

Real PostgreSQL, a real Temporal server, real node-agent workers on simulated hosts (the workflow lab), the API
called through httpx.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from store.models import TenantRow
from store.tokens import create_token
from tests.api.stack import app_for, bearer, control_worker_seen, http_client
from tests.workflows.lab import FAST, Lab, lab_fleet, running_lab
from workflows import allocation_client
from workflows.allocation import AllocationWorkflow

HISTORIES = Path(__file__).parent / "histories"


async def replays(handle: WorkflowHandle[Any, Any]) -> None:
    """The run's history replays on the current code (and is kept under histories/ with BERTH_RECORD_HISTORIES=1,
    so later changes must keep replaying it)."""
    history = await handle.fetch_history()
    await Replayer(workflows=[AllocationWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)
    if os.environ.get("BERTH_RECORD_HISTORIES"):
        (HISTORIES / f"{history.workflow_id.replace('/', '_')}.json").write_text(history.to_json())


def with_pool_deadlines(fleet_text: str, deadlines: dict[str, str]) -> str:
    """The lab fleet with `deadlines` on its slice pool, as an operator would write them in the fleet file."""
    documents = list(yaml.safe_load_all(fleet_text))
    for document in documents:
        if document["kind"] == "InferenceCluster":
            document["spec"]["nodePools"][0]["deadlines"] = deadlines
    return yaml.safe_dump_all(documents, sort_keys=False)


@asynccontextmanager
async def api_over(
    lab_context: Any, sessions: async_sessionmaker[AsyncSession], temporal: Client
) -> AsyncIterator[tuple[Lab, httpx.AsyncClient, dict[str, str]]]:
    async with lab_context as lab:
        async with sessions.begin() as session:
            admin = bearer(await create_token(session, "admin", label="tests"))
        app = app_for(sessions, temporal, lab.queues)
        await control_worker_seen(app)
        async with http_client(app) as http:
            yield lab, http, admin


async def get(http: httpx.AsyncClient, admin: dict[str, str], allocation_id: str) -> dict[str, Any]:
    response = await http.get(f"/v1/allocations/{allocation_id}", headers=admin)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_vm_that_never_gets_ready_fails_at_its_pools_waiting_ready_deadline(
    temporal_env, temporal_client, sessions, tmp_path: Path
) -> None:
    """The pool's 15-minute deadline passes long before the 30-minute readiness timeout (skipped in virtual time):
    the allocation fails naming the state, the node and the deadline, and leaves nothing behind."""
    fleet = with_pool_deadlines(
        lab_fleet({"slow": {"gpus": 2, "simulation": {"neverReady": True}}}), {"waitingReady": "15m"}
    )
    timing = FAST.model_copy(update={"readiness_timeout_seconds": 1800.0, "readiness_poll_seconds": 300.0})
    lab_context = running_lab(temporal_env.client, temporal_client, sessions, tmp_path, fleet)
    async with api_over(lab_context, sessions, temporal_client) as (lab, http, admin):
        handle = await lab.allocate("deadline-waiting-ready", gpus=2, timing=timing)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        allocation = await get(http, admin, "deadline-waiting-ready")
        reason = "deadline_exceeded: waiting_ready took longer than 15m0s on node slow"
        assert allocation["state"] == "failed"
        assert allocation["failure_reason"] == reason
        assert [(a["node"], a["outcome"], a["reason"]) for a in allocation["attempts"]] == [("slow", "failed", reason)]
        # Compensated: no VM, no claim, no lease, every slot free again.
        assert lab.vm_records() == [] and lab.lease_files() == []
        assert await lab.active_claims() == {}
        assert set((await lab.slot_states()).values()) == {"available"}
        await replays(handle)


async def test_without_pool_deadlines_the_defaults_leave_the_readiness_timeout_in_charge(
    temporal_env, temporal_client, sessions, tmp_path: Path
) -> None:
    """The default waiting_ready deadline (20 minutes) is longer than the default readiness timeout (10 minutes):
    a node that never gets ready is still just a failed attempt, and the next candidate serves the request."""
    fleet = lab_fleet({"a-slow": {"gpus": 2, "simulation": {"neverReady": True}}, "b-fine": {"gpus": 4}})
    timing = FAST.model_copy(update={"readiness_timeout_seconds": 600.0, "readiness_poll_seconds": 150.0})
    async with running_lab(temporal_env.client, temporal_client, sessions, tmp_path, fleet) as lab:
        handle = await lab.allocate("patient", gpus=2, timing=timing)
        status = await lab.wait_for_state(handle, "active", timeout=90)
        assert [(a.node, a.outcome) for a in status.attempts] == [("a-slow", "failed"), ("b-fine", "succeeded")]
        assert status.attempts[0].reason.startswith("readiness_timeout: not ready after 600s")
        await allocation_client.release(temporal_client, "patient")
        await handle.result()


async def test_a_quota_refusal_at_claim_time_is_a_failed_attempt_with_the_quota_reason(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """The tenant's quota shrinks while the node is planning (an operator applied a new fleet): the claim is
    refused, the attempt is failed with that reason (not `cancelled`), the lease is released and the allocation
    fails with quota_exceeded."""
    timing = FAST.model_copy(update={"agent_pickup_seconds": 30.0})
    lab_context = running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"h1": {"gpus": 4}}))
    async with api_over(lab_context, sessions, temporal_client) as (lab, http, admin):
        await lab.stop_agent("h1")  # it has reported and counts as live; its tasks wait until it is back
        handle = await lab.allocate("quota-at-claim", gpus=2, timing=timing)
        await lab.wait_for_state(handle, "planning")  # the plan waits for h1's agent
        async with sessions.begin() as session:
            await session.execute(update(TenantRow).where(TenantRow.name == "acme").values(gpu_quota=1))
        await lab.start_agent("h1")
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        allocation = await get(http, admin, "quota-at-claim")
        reason = "quota_exceeded: tenant acme holds 0 GPUs and has 0 in flight; 2 more would exceed its quota of 1"
        assert allocation["state"] == "failed" and allocation["failure_reason"] == reason
        assert [(a["node"], a["outcome"], a["reason"]) for a in allocation["attempts"]] == [("h1", "failed", reason)]
        assert lab.lease_files() == [] and await lab.active_claims() == {}
        await replays(handle)


async def test_a_node_whose_attempts_keep_failing_cools_off_and_explain_says_so(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """`bad` ranks first for 2 GPUs (best fit) but cannot create VMs. After 3 failed attempts within 5 minutes
    (the default breaker) it is not ranked: the next allocation goes straight to `good`, and explain and capacity
    name the cool-off."""
    fleet = lab_fleet({"bad": {"gpus": 2, "simulation": {"failCreate": True}}, "good": {"gpus": 4}})
    lab_context = running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet)
    async with api_over(lab_context, sessions, temporal_client) as (lab, http, admin):
        for n in range(3):
            handle = await lab.allocate(f"try-{n}", gpus=2)
            status = await lab.wait_for_state(handle, "active")
            assert [(a.node, a.outcome) for a in status.attempts] == [("bad", "failed"), ("good", "succeeded")]
            await allocation_client.release(temporal_client, f"try-{n}")
            await handle.result()

        explained = await http.post("/v1/explain?detail=true", json={"gpu_count": 2}, headers=admin)
        assert explained.status_code == 200, explained.text
        node_level = next(level for level in explained.json()["explanation"]["levels"] if level["level"] == "node")
        assert node_level["dropped"] == {"node_cooling_off": 1}
        assert "1 is cooling off after repeated failed attempts" in node_level["summary"]
        (bad,) = [item for item in node_level["items"] if item["name"] == "bad"]
        assert bad["reason"] == "node_cooling_off"
        assert "cooling off after 3 failed attempts within 5m0s, until 20" in bad["detail"]
        assert [c["node"] for c in explained.json()["candidates"]] == ["good"]

        capacity = await http.get("/v1/capacity", headers=admin)
        (pool,) = capacity.json()["pools"]
        assert pool["cooling_off"] == 1

        after = await lab.allocate("after", gpus=2)
        status = await lab.wait_for_state(after, "active")
        assert [(a.node, a.outcome) for a in status.attempts] == [("good", "succeeded")]
        await allocation_client.release(temporal_client, "after")
        await after.result()
