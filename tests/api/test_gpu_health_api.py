"""A GPU that fails under an active allocation, end to end through the API: the node's agent (simulated
host, its real report loop) reports the slot `failed` with its own token; the allocation holding it goes `degraded`
with the reason and keeps running; the slot takes no new work, even once free, until an operator repairs it; the
repair is in the audit trail and the agent is asked for its verdicts again. A failure whose signal was lost is found
by the reconciler and told."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from sqlalchemy import select, update

from agent.reporter import NodeReporter
from scheduler.host.report import NodeReport, ReportReply
from store.audit import AuditRepairRow
from store.models import SlotRow
from tests.agent.test_guest_health import recorded
from tests.api.stack import Stack, app_for, bearer, http_client


class ApiSink:
    """The agent's reports through the API's report route, with the node's own token (as HttpReportSink sends
    them, without the HTTP hop)."""

    def __init__(self, stack: Stack, token: str, http: httpx.AsyncClient | None = None) -> None:
        self.http, self.headers = http or stack.http, bearer(token)

    async def send(self, node: str, report: NodeReport) -> ReportReply:
        response = await self.http.post(
            f"/v1/nodes/{node}/report",
            content=report.model_dump_json(exclude_none=True),
            headers={**self.headers, "Content-Type": "application/json"},
        )
        assert response.status_code == 200, response.text
        return ReportReply.model_validate(response.json())


def _fail_gpu(stack: Stack, node: str, index: int, gpu: str) -> None:
    """The simulated host's sysfs for that slot: its GPU gone from the bus (agent/simulated.py reads this file)."""
    path = stack.lab.home / "nodes" / node / "health.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({str(index): {"gpu": {"address": gpu, "present": False}}}))


async def _node(stack: Stack, node: str) -> dict[str, Any]:
    response = await stack.http.get(f"/v1/nodes/{node}", headers=stack.admin)
    assert response.status_code == 200, response.text
    return response.json()


async def _told(stack: Stack, allocation_id: str) -> list[dict[str, Any]]:
    """The allocation's `gpu_failed` events once it is `degraded` and its trail says so (the live state may come
    from the workflow a moment before its events are written)."""
    for _ in range(300):
        allocation = await stack.get(allocation_id)
        told = [e for e in allocation["events"] if e["step"] == "gpu_failed"]
        if allocation["state"] == "degraded" and told:
            return told
        await asyncio.sleep(0.1)
    raise AssertionError(f"{allocation_id} was never told: {allocation}")


async def test_a_failed_gpu_degrades_its_allocation_and_its_slot_waits_for_a_repair(stack: Stack) -> None:
    held = await stack.create(4)
    active = await stack.wait_for(held, "active")
    assert active["node"] == "big"  # the only node with 4 GPUs
    reporter = NodeReporter(stack.lab.agent("big"), ApiSink(stack, await stack.lab.node_token("big")))
    await reporter.report_once()  # every slot healthy
    assert (await _node(stack, "big"))["unhealthy"] == []

    gpu = next(b["gpu_pci"] for b in active["bundles"] if b["slot_id"] == "big/1")
    _fail_gpu(stack, "big", 1, gpu)
    await reporter.report_once()
    [event] = await _told(stack, held)
    assert (event["step"], event["state"]) == ("gpu_failed", "degraded")
    assert event["reason"].startswith(f"the GPU of slot big/1 failed (the GPU {gpu} is gone from the PCI bus)")
    [sick] = (await _node(stack, "big"))["unhealthy"]
    assert (sick["index"], sick["health"], sick["reasons"]) == (
        1,
        "failed",
        [f"the GPU {gpu} is gone from the PCI bus"],
    )

    signals = {s["index"]: s for s in (await _node(stack, "big"))["signals"]}
    assert sorted(signals) == [0, 1, 2, 3]
    assert (signals[1]["health"], signals[1]["signals"]["gpu"]) == ("failed", f"{gpu} not on the PCI bus")
    assert signals[0]["signals"]["gpu"].endswith(
        "on vfio-pci, AER fatal/non-fatal/correctable 0/0/0, link 32.0 GT/s x16 of 32.0 GT/s x16"
    )

    [pool] = (await stack.http.get("/v1/capacity", headers=stack.admin)).json()["pools"]
    assert (pool["degraded_gpus"], pool["failed_gpus"]) == (0, 1)
    metrics = (await stack.http.get("/metrics")).text
    assert 'berth_gpu_health{health="failed",pool="lab-1/slices",reason="gone"} 1.0' in metrics
    assert 'berth_gpu_health{health="healthy",pool="lab-1/slices",reason="none"} 6.0' in metrics

    # Released, the slot is free but takes no new work: no node has 4 healthy GPUs now.
    assert (await stack.http.delete(f"/v1/allocations/{held}", headers=stack.acme)).status_code == 202
    await stack.wait_for(held, "released")
    refused = await stack.wait_for(await stack.create(4), "failed")
    assert "unhealthy GPUs" in refused["failure_reason"]

    # Marked repaired while the GPU is still gone: the agent is asked for its verdicts again, and the slot fails again.
    forbidden = await stack.http.post("/v1/nodes/big/repair", json={"slots": [1]}, headers=stack.acme)
    assert forbidden.status_code == 403
    unknown = await stack.http.post("/v1/nodes/big/repair", json={"slots": [9]}, headers=stack.admin)
    assert unknown.status_code == 404 and unknown.json()["error"]["message"] == "node big has no slot 9"
    too_soon = await stack.http.post("/v1/nodes/big/repair", json={"slots": [1]}, headers=stack.admin)
    assert too_soon.status_code == 200, too_soon.text
    assert too_soon.json() == {
        "node": "big",
        "repaired": [{"index": 1, "was": "failed", "reason": (f"the GPU {gpu} is gone from the PCI bus")}],
    }
    assert (await _node(stack, "big"))["unhealthy"] == []
    assert (await reporter.report_once()).send_health  # the agent's verdict did not change: asked for it again
    await reporter.report_once()
    assert [s["health"] for s in (await _node(stack, "big"))["unhealthy"]] == ["failed"]

    # The GPU replaced: the agent sees it again, but a failed slot waits for the operator; then it takes work.
    (stack.lab.home / "nodes" / "big" / "health.json").unlink()
    await reporter.report_once()
    assert [s["health"] for s in (await _node(stack, "big"))["unhealthy"]] == ["failed"]
    assert (await stack.http.post("/v1/nodes/big/repair", json={"slots": [1]}, headers=stack.admin)).status_code == 200
    await reporter.report_once()
    await reporter.report_once()
    assert (await _node(stack, "big"))["unhealthy"] == []
    async with stack.lab.sessions() as session:
        trail = (await session.scalars(select(AuditRepairRow).where(AuditRepairRow.kind == "gpu_repaired"))).all()
    assert [(r.node, r.slot_indexes, r.action) for r in trail] == [("big", [1], "mark_repaired")] * 2
    again = await stack.create(4)
    assert (await stack.wait_for(again, "active"))["node"] == "big"
    assert (await stack.http.delete(f"/v1/allocations/{again}", headers=stack.acme)).status_code == 202
    await stack.wait_for(again, "released")


async def test_a_failure_whose_signal_was_lost_is_told_by_the_reconciler(stack: Stack) -> None:
    held = await stack.create(2)
    node = (await stack.wait_for(held, "active"))["node"]
    async with stack.lab.sessions.begin() as session:  # the verdict stored, the API's signal lost
        await session.execute(
            update(SlotRow)
            .where(SlotRow.node_id == node, SlotRow.slot_index == 0)
            .values(health="failed", health_reason="Xid 79 (GPU has fallen off the bus): NVIDIA says RESTART_BM")
        )
    found = (await stack.http.post("/v1/audit", headers=stack.admin)).json()
    assert found["counts"] == {"gpu_failure_untold": 1}
    [finding] = found["report"]["findings"]
    assert (finding["allocation_id"], finding["repair"]) == (held, "tell_allocation")
    repaired = (await stack.http.post("/v1/audit", json={"repair": True}, headers=stack.admin)).json()
    assert [(r["action"], r["outcome"]) for r in repaired["report"]["repairs"]] == [("tell_allocation", "done")]
    told = await _told(stack, held)  # the audit's own event may come after it
    assert len(told) == 1 and "Xid 79 (GPU has fallen off the bus)" in told[0]["reason"]
    assert (await stack.http.post("/v1/audit", headers=stack.admin)).json()["counts"] == {}
    assert (await stack.http.delete(f"/v1/allocations/{held}", headers=stack.acme)).status_code == 202
    await stack.wait_for(held, "released")


async def test_a_drain_marks_the_node_draining_and_tells_each_allocation_on_it_once(stack: Stack) -> None:
    held = await stack.create(4)
    assert (await stack.wait_for(held, "active"))["node"] == "big"
    assert (await stack.http.post("/v1/nodes/big/drain", headers=stack.acme)).status_code == 403
    drained = await stack.http.post("/v1/nodes/big/drain", headers=stack.admin)
    assert drained.status_code == 200, drained.text
    assert (drained.json()["node"]["status"], drained.json()["told"]) == ("DRAINING", [held])
    await stack.http.post("/v1/nodes/big/drain", headers=stack.admin)  # again: the owner is not told twice
    for _ in range(100):
        events = (await stack.get(held))["events"]
        if any(e["step"] == "drain_notice" for e in events):
            break
        await asyncio.sleep(0.1)
    notices = [e for e in (await stack.get(held))["events"] if e["step"] == "drain_notice"]
    assert len(notices) == 1 and notices[0]["state"] == "active"
    assert notices[0]["reason"].startswith("node big is being drained (an operator's drain): release this allocation")
    other = await stack.create(2)
    assert (await stack.wait_for(other, "active"))["node"] != "big"  # cordoned: no new work
    for allocation in (held, other):
        assert (await stack.http.delete(f"/v1/allocations/{allocation}", headers=stack.acme)).status_code == 202
        await stack.wait_for(allocation, "released")
    assert (await stack.http.post("/v1/nodes/big/uncordon", headers=stack.admin)).status_code == 200


async def test_a_gpu_its_guest_says_is_lost_degrades_its_allocation(stack: Stack) -> None:
    """The guest's side: the simulated guest answers with the recorded `nvidia-smi -q` and kernel log
    of a GPU that fell off the bus (tests/hosts/guest/xid79), read through the real parser by the agent's loop."""
    held = await stack.create(2)
    active = await stack.wait_for(held, "active")
    node = active["node"]
    reporter = NodeReporter(stack.lab.agent(node), ApiSink(stack, await stack.lab.node_token(node)))
    await reporter.report_once()
    smi, kernel = recorded("xid79")
    said = {"nvidia_smi": vars(smi), "dmesg": vars(kernel)}
    guest = stack.lab.home / "nodes" / node / "guest" / f"{held}.json"
    guest.parent.mkdir(parents=True, exist_ok=True)
    guest.write_text(json.dumps(said))
    await reporter.report_once()
    [event] = await _told(stack, held)
    assert event["reason"].startswith(
        f"the GPU of slot {node}/0 failed (the guest's driver lost the GPU (nvidia-smi -q: GPU is lost))"
    )
    unhealthy = {s["index"]: s["reasons"] for s in (await _node(stack, node))["unhealthy"]}
    assert unhealthy[0] == [
        "the guest's driver lost the GPU (nvidia-smi -q: GPU is lost)",
        "Xid 79 (GPU has fallen off the bus): NVIDIA says RESTART_BM",
    ]
    assert (await stack.http.delete(f"/v1/allocations/{held}", headers=stack.acme)).status_code == 202
    await stack.wait_for(held, "released")


async def test_a_repair_through_one_api_process_reaches_an_agent_reporting_to_another(stack: Stack) -> None:
    """Several API processes each answer an agent's steady reports from their own memory. A repair
    served by one must still get the agent asked for its verdicts again when its reports land on another."""
    other = app_for(stack.lab.sessions, stack.lab.starter, stack.lab.queues)
    other.state.services.heartbeats.flush_every = 0  # it writes (and reads back) at every steady report
    async with http_client(other) as http:
        reporter = NodeReporter(stack.lab.agent("big"), ApiSink(stack, await stack.lab.node_token("big"), http))
        await reporter.report_once()  # the full way: the other process now knows the node
        assert not (await reporter.report_once()).send_health  # steady, answered from its memory

        repaired = await stack.http.post("/v1/nodes/big/repair", json={"slots": [2]}, headers=stack.admin)
        assert repaired.status_code == 200, repaired.text
        replies = [await reporter.report_once() for _ in range(2)]
    assert replies[-1].send_health  # at most one steady answer more, then asked again
