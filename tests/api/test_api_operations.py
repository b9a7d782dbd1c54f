"""Operators acting on allocations through the API: cancel, retry (running and failed), and what happens when the
control plane cannot be reached."""

from __future__ import annotations

from sqlalchemy import func, select
from temporalio.client import Client

from api.temporal import TemporalTimeouts
from contracts.task_queues import Queues
from store.models import AllocationRow
from tests.api.stack import Stack, app_for, control_worker_seen, http_client


async def test_cancel_while_placing_gives_everything_back(stack: Stack) -> None:
    allocation_id = await stack.create(1)  # lands on `slow`, which never boots
    await stack.wait_for(allocation_id, "waiting_ready")
    response = await stack.http.post(f"/v1/allocations/{allocation_id}/cancel", headers=stack.acme)
    assert response.status_code == 202
    assert response.json()["state"] == "waiting_ready"  # cancellation is under way, not done
    final = await stack.wait_for(allocation_id, "cancelled")
    assert final["attempts"] == [{"number": 1, "node": "slow", "outcome": "cancelled", "reason": None}]
    assert await stack.lab.active_claims() == {}
    assert stack.lab.vm_records() == []

    # A cancel sent again (its first answer lost, say) is told it is done, not refused; nothing more is recorded.
    twice = await stack.http.post(f"/v1/allocations/{allocation_id}/cancel", headers=stack.acme)
    assert (twice.status_code, twice.json()["state"]) == (202, "cancelled"), twice.text
    again = await stack.get(allocation_id)
    assert [e["step"] for e in again["events"]].count("cancel_requested") == 1
    retry = await stack.http.post(f"/v1/allocations/{allocation_id}/retry", headers=stack.admin)
    assert retry.status_code == 409


async def test_retry_while_placing_moves_to_another_node(stack: Stack) -> None:
    allocation_id = await stack.create(1)
    await stack.wait_for(allocation_id, "waiting_ready")
    release = await stack.http.delete(f"/v1/allocations/{allocation_id}", headers=stack.acme)
    assert release.status_code == 409  # the workflow's validator refused; the answer keeps the API's words
    assert release.json()["error"] == {
        "code": "invalid_state",
        "message": f"allocation {allocation_id} is waiting_ready; only an active one can be released (cancel it instead)",
        "details": None,
    }

    response = await stack.http.post(
        f"/v1/allocations/{allocation_id}/retry", json={"exclude_nodes": ["small"]}, headers=stack.admin
    )
    assert response.status_code == 202, response.text
    active = await stack.wait_for(allocation_id, "active")
    assert active["node"] == "big"
    assert [(a["node"], a["outcome"]) for a in active["attempts"]] == [("slow", "abandoned"), ("big", "succeeded")]
    assert active["attempts"][0]["reason"].startswith("operator_retry")
    retried_again = await stack.http.post(f"/v1/allocations/{allocation_id}/retry", headers=stack.admin)
    assert retried_again.status_code == 409
    assert retried_again.json()["error"]["message"] == (
        f"allocation {allocation_id} is active; only one being placed or failed can be retried"
    )


async def test_a_failed_allocation_is_retried_as_a_new_run(stack: Stack) -> None:
    for node in ("slow", "small", "big"):
        assert (await stack.http.post(f"/v1/nodes/{node}/cordon", headers=stack.admin)).status_code == 200
    allocation_id = await stack.create(2)
    failed = await stack.wait_for(allocation_id, "failed")
    assert failed["failure_reason"].startswith("insufficient_capacity"), failed["failure_reason"]
    metrics = (await stack.http.get("/metrics")).text
    assert 'berth_allocation_refusals{reason="insufficient_capacity"} 1.0' in metrics
    assert 'berth_allocations{state="failed"} 1.0' in metrics

    assert (await stack.http.post("/v1/nodes/small/uncordon", headers=stack.admin)).status_code == 200
    # Retrying is an operator's action: a tenant's member token may not.
    refused = await stack.http.post(f"/v1/allocations/{allocation_id}/retry", json={}, headers=stack.acme)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    response = await stack.http.post(f"/v1/allocations/{allocation_id}/retry", json={}, headers=stack.admin)
    assert response.status_code == 202, response.text
    assert response.json()["state"] == "pending"
    active = await stack.wait_for(allocation_id, "active")
    assert active["node"] == "small" and active["failure_reason"] is None
    steps = [e["step"] for e in active["events"]]
    assert steps.count("select_region") == 2 and "failed" in steps  # both runs' stories are kept
    assert [(a["node"], a["outcome"]) for a in active["attempts"]] == [("small", "succeeded")]


async def test_no_control_worker_is_503_and_changes_nothing(stack: Stack, temporal_client: Client) -> None:
    allocation_id = await stack.create(2)
    await stack.wait_for(allocation_id, "active")
    # The same database and Temporal, but a control queue no worker polls.
    nobody = Queues(control=f"{stack.lab.queues.control}.unpolled", node_prefix=stack.lab.queues.node_prefix)
    async with http_client(app_for(stack.lab.sessions, temporal_client, nobody)) as http:
        create = await http.post("/v1/allocations", json={"gpu_count": 1}, headers=stack.acme)
        assert create.status_code == 503
        assert create.headers["retry-after"] == "5"
        error = create.json()["error"]
        assert error["code"] == "no_control_worker" and "berth worker control" in error["message"]
        for method, path, who in [
            ("POST", f"/v1/allocations/{allocation_id}/cancel", stack.acme),
            ("POST", f"/v1/allocations/{allocation_id}/retry", stack.admin),
            ("DELETE", f"/v1/allocations/{allocation_id}", stack.acme),
        ]:
            response = await http.request(method, path, headers=who)
            # a retry of an active allocation too: the workflow's update validator decides, and no worker runs it
            assert response.status_code == 503, (path, response.text)
        read = await http.get(f"/v1/allocations/{allocation_id}", headers=stack.acme)
        assert read.status_code == 200 and read.json()["state"] == "active"
    async with stack.lab.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AllocationRow)) == 1
    assert (await stack.get(allocation_id))["state"] == "active"


async def test_a_release_whose_answer_is_lost_keeps_who_asked_and_is_done_when_sent_again(stack: Stack) -> None:
    """The control worker stops; the server still lists it as a recent poller, so the release is sent and waits in
    Temporal for a worker. The caller is not told "nothing was changed" (a worker coming back takes it), the trail
    keeps who asked, and the release sent again answers 202 however the first one ended."""
    allocation_id = await stack.create(2)
    await stack.wait_for(allocation_id, "active")
    control, task = stack.lab.control
    await control.shutdown()
    await task
    stack.lab.control = None

    lost = await stack.http.delete(f"/v1/allocations/{allocation_id}", headers=stack.acme)
    assert lost.status_code == 503, lost.text
    assert lost.headers["retry-after"] == "5"
    error = lost.json()["error"]
    assert error["code"] == "outcome_unknown"
    assert error["message"].startswith(
        f"the release of allocation {allocation_id} was sent, but no Berth control worker answered within 3s, so "
        "whether it was carried out is unknown"
    )
    assert "safe to send again" in error["message"]
    read = await stack.get(allocation_id)
    assert (read["state"], read["live"]) == ("active", False)  # served from PostgreSQL alone
    [asked] = [e for e in read["events"] if e["step"] == "release_requested"]
    assert asked["actor"] == read["requested_by"]

    stack.lab.start_control()
    await control_worker_seen(stack.http._transport.app)  # type: ignore[attr-defined]
    again = await stack.http.delete(f"/v1/allocations/{allocation_id}", headers=stack.acme)
    assert again.status_code == 202, again.text
    released = await stack.wait_for(allocation_id, "released")
    asked = [e for e in released["events"] if e["step"] == "release_requested"]
    assert asked and {e["actor"] for e in asked} == {read["requested_by"]}
    assert await stack.lab.active_claims() == {}

    once_more = await stack.http.delete(f"/v1/allocations/{allocation_id}", headers=stack.acme)
    assert (once_more.status_code, once_more.json()["state"]) == (202, "released"), once_more.text


async def test_temporal_unreachable_is_503_and_leaves_no_row(stack: Stack) -> None:
    app = app_for(
        stack.lab.sessions,
        None,
        stack.lab.queues,
        TemporalTimeouts(connect_seconds=1.0),
        temporal_address="127.0.0.1:9",
    )
    async with http_client(app) as http:
        response = await http.post("/v1/allocations", json={"gpu_count": 1}, headers=stack.acme)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "temporal_unavailable"
        health = await http.get("/healthz")
        assert health.status_code == 503
        assert health.json() == {
            "status": "unavailable",
            "database": "ok",
            "temporal": "unreachable",
            "control_workers": 0,
        }
    async with stack.lab.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AllocationRow)) == 0


async def test_a_cancel_sent_again_while_it_gives_back_is_told_it_is_under_way(stack: Stack) -> None:
    """A cancel of an active allocation gives back what it holds (`releasing`) before it ends `cancelled`; the same
    cancel sent again meanwhile (a retry after a lost answer) is a 202, not a refusal. The node's agent is stopped,
    so the teardown waits for it and the allocation stays `releasing` while the second cancel is sent."""
    allocation_id = await stack.create(2)
    await stack.wait_for(allocation_id, "active")
    await stack.lab.stop_agent("small")
    first = await stack.http.post(f"/v1/allocations/{allocation_id}/cancel", headers=stack.acme)
    assert first.status_code == 202, first.text
    await stack.wait_for(allocation_id, "releasing")
    again = await stack.http.post(f"/v1/allocations/{allocation_id}/cancel", headers=stack.acme)
    assert (again.status_code, again.json()["state"]) == (202, "releasing"), again.text

    other = await stack.create(4)  # on `big`; a release, not a cancel, is under way there
    await stack.wait_for(other, "active")
    await stack.lab.stop_agent("big")
    assert (await stack.http.delete(f"/v1/allocations/{other}", headers=stack.acme)).status_code == 202
    await stack.wait_for(other, "releasing")
    refused = await stack.http.post(f"/v1/allocations/{other}/cancel", headers=stack.acme)
    assert refused.status_code == 409 and "releasing" in refused.json()["error"]["message"], refused.text
