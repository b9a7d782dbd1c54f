"""Deadlines and the node breaker, as a user sees them through the API: an allocation that overstays a state
gives everything back and fails naming the state and node; a quota refusal at claim time is a failed attempt with
its reason; a node whose attempts keep failing is not ranked while it cools off, and explain and capacity say so.

Real PostgreSQL, a real Temporal server, real node-agent workers on simulated hosts (the workflow lab), the API
called through httpx.
"""

from __future__ import annotations

import asyncio
import os
import time
import typing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.actions import run_histories
from store.models import SlotRow, TenantRow
from store.tokens import create_token
from tests.api.stack import app_for, bearer, control_worker_seen, http_client
from tests.workflows.lab import FAST, Lab, lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.workflow import AllocationWorkflow

HISTORIES = Path(__file__).parent / "histories"


async def replays(client: Client, handle: WorkflowHandle[Any, Any]) -> None:
    """The workflow's histories (its one run, or two when a hold handed over) replay on the
    current code, and are kept under histories/ with BERTH_RECORD_HISTORIES=1, so later changes must keep replaying
    them."""
    histories = await run_histories(client, handle.id)
    for history in histories:
        await Replayer(workflows=[AllocationWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)
    if os.environ.get("BERTH_RECORD_HISTORIES"):
        for number, history in enumerate(histories, start=1):
            name = history.workflow_id.replace("/", "_") + (f"_{number}" if len(histories) > 1 else "")
            (HISTORIES / f"{name}.json").write_text(history.to_json())


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
        # Compensated: no VM, no claim, no lease, every slot free again.
        reason = await failed_and_undone(lab, http, admin, "deadline-waiting-ready")
        assert reason == "deadline_exceeded: waiting_ready took longer than 15m0s on node slow"
        await replays(temporal_client, handle)


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
        reason = (
            "quota_exceeded: tenant acme would exceed its GPU quota: 0 active + 0 in flight + 2 requested > quota 1"
        )
        assert allocation["state"] == "failed" and allocation["failure_reason"] == reason
        assert [(a["node"], a["outcome"], a["reason"]) for a in allocation["attempts"]] == [("h1", "failed", reason)]
        assert lab.lease_files() == [] and await lab.active_claims() == {}
        await replays(temporal_client, handle)


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


def slowed(lab: Lab, node: str, activity_name: str, seconds: float) -> list[object]:
    """The node's agent activities with one of them taking `seconds` longer (a host that hangs on it), without
    heartbeating meanwhile, as a create stuck in the hypervisor would."""
    agent = lab.agent(node)
    activities = agent.activities()
    real = next(a for a in activities if a.__temporal_activity_definition.name == activity_name)  # type: ignore[attr-defined]

    def slow(request: Any) -> Any:
        time.sleep(seconds)
        return real(request)

    slow.__annotations__ = typing.get_type_hints(real)  # the same typed argument and result as the real one
    slowed_activity = activity.defn(name=activity_name)(slow)
    return [slowed_activity if a is real else a for a in activities]


@asynccontextmanager
async def slow_host(
    temporal: Client,
    sessions: async_sessionmaker[AsyncSession],
    home: Path,
    deadlines: dict[str, str],
    activity_name: str,
    seconds: float,
) -> AsyncIterator[tuple[Lab, httpx.AsyncClient, dict[str, str]]]:
    """One host `h1` in a pool with `deadlines`, whose agent takes `seconds` longer over `activity_name`."""
    fleet = with_pool_deadlines(lab_fleet({"h1": {"gpus": 2}}), deadlines)
    async with api_over(running_lab(temporal, temporal, sessions, home, fleet), sessions, temporal) as stack:
        lab = stack[0]
        await lab.stop_agent("h1")
        await lab.start_agent("h1", activities=slowed(lab, "h1", activity_name, seconds), report=False)
        yield stack


async def failed_and_undone(lab: Lab, http: httpx.AsyncClient, admin: dict[str, str], allocation_id: str) -> str:
    """The allocation's failure reason, once its only attempt is shown failed with it and nothing is left held."""
    allocation = await get(http, admin, allocation_id)
    reason = allocation["failure_reason"]
    assert allocation["state"] == "failed"
    assert [(a["outcome"], a["reason"]) for a in allocation["attempts"]] == [("failed", reason)]
    assert lab.vm_records() == [] and lab.lease_files() == []
    assert await lab.active_claims() == {}
    assert set((await lab.slot_states()).values()) == {"available"}
    return reason


async def test_a_create_past_the_provisioning_deadline_is_waited_for_then_undone(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """The create hangs for 3 s against a 1 s deadline: the workflow cancels it and waits for it to stop (it makes
    its VM anyway), then destroys that VM; nothing is left and the reason names the state and node."""
    async with slow_host(temporal_client, sessions, tmp_path, {"provisioning": "1s"}, "create_vm", 3.0) as stack:
        lab, http, admin = stack
        handle = await lab.allocate("deadline-provisioning", gpus=2)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        reason = await failed_and_undone(lab, http, admin, "deadline-provisioning")
        assert reason == "deadline_exceeded: provisioning took longer than 1s on node h1"


async def test_a_release_past_its_deadline_quarantines_the_slots_and_still_completes(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """Teardown hangs for 4 s against a 1 s releasing deadline: the release completes at once, the slots are
    quarantined with the reason, and the recovery workflow wipes and frees them once the teardown goes through."""
    async with slow_host(temporal_client, sessions, tmp_path, {"releasing": "1s"}, "destroy_vm", 4.0) as stack:
        lab, http, admin = stack
        handle = await lab.allocate("deadline-releasing", gpus=2)
        await lab.wait_for_state(handle, "active")
        await allocation_client.release(temporal_client, "deadline-releasing")
        status = await handle.result()
        assert status.state == "released"
        assert (await get(http, admin, "deadline-releasing"))["state"] == "released"
        assert set((await lab.slot_states()).values()) == {"quarantined"}
        # (GET /v1/nodes shows these reasons, but answers 500 while a slot is quarantined: api/routes/nodes.py `_info`
        # shadows its `quarantined` list with the count; reported. Read them where it reads them.)
        async with sessions() as session:
            reasons = set((await session.scalars(select(SlotRow.quarantine_reason))).all())
        assert reasons == {
            "deadline-releasing: wipe not confirmed: deadline_exceeded: releasing took longer than 1s on node h1"
        }
        for _ in range(100):  # the recovery workflow's teardown takes its 4 s, then lifts the quarantine
            if set((await lab.slot_states()).values()) == {"available"}:
                break
            await asyncio.sleep(0.1)
        assert set((await lab.slot_states()).values()) == {"available"}
        assert lab.vm_records() == []
