"""`POST /v1/nodes/{node}/report`: a node agent reports its host with its own node token, and only for its own node;
`GET /v1/nodes/{node}` then shows what an operator must fix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml
from temporalio.service import RPCError

from agent.host.sysfs import discover_host
from scheduler.host.report import AgentInfo, NodeReport
from store.tokens import create_token, revoke_tokens
from tests.api.stack import Stack, api_fleet, bearer
from tests.hosts import sysfs_tree

JSON = {"Content-Type": "application/json"}
AGENT = AgentInfo(version="test", interval_seconds=30)


async def _node_token(stack: Stack, node: str) -> dict[str, str]:
    async with stack.lab.sessions.begin() as session:
        return bearer(await create_token(session, "node", node=node, label="test"))


def _body(report: NodeReport) -> str:
    return report.model_dump_json(exclude_none=True)


async def test_an_agent_reports_for_its_own_node_only(stack: Stack, tmp_path: Path) -> None:
    small = await _node_token(stack, "small")
    host = discover_host(sysfs_tree.gpu_on_nvidia().write(tmp_path))  # not small's hardware: every slot fails
    report = NodeReport(agent=AGENT, topology=host.topology_hash(), host=host)

    other = await stack.http.post("/v1/nodes/big/report", content=_body(report), headers=small | JSON)
    assert other.status_code == 403, other.text
    assert "cannot report for node 'big'" in other.json()["error"]["message"]
    tenant = await stack.http.post("/v1/nodes/small/report", content=_body(report), headers=stack.acme | JSON)
    assert tenant.status_code == 403
    elsewhere = await stack.http.get("/v1/allocations", headers=small)
    assert elsewhere.status_code == 403  # a node token is good for its report and nothing else

    accepted = await stack.http.post("/v1/nodes/small/report", content=_body(report), headers=small | JSON)
    assert accepted.status_code == 200, accepted.text
    reply = accepted.json()
    assert reply["live"] and not reply.get("send_host") and len(reply["slots"]) == 2
    assert [v["checks"][0] for v in reply["validation"]["slots"]] == ["gpu_absent", "gpu_absent"]

    shown = (await stack.http.get("/v1/nodes/small", headers=stack.admin)).json()
    assert shown["validated_gpus"] == 0 and [s["reason"] for s in shown["invalid_slots"]] == ["gpu_absent"] * 2
    assert "0000:10:00.0 is not on this host" in shown["invalid_slots"][0]["message"]
    explained = await stack.http.post("/v1/explain", json={"gpu_count": 2}, headers=stack.acme, params={"detail": 1})
    node_level = next(level for level in explained.json()["explanation"]["levels"] if level["level"] == "node")
    assert {item["name"]: item.get("reason") for item in node_level["items"]}["small"] == "slots_invalid"

    # A heartbeat (no host, same topology and approval) is answered from memory and keeps the node live.
    beat = NodeReport(agent=AGENT, topology=host.topology_hash(), approved=reply["approved"])
    again = await stack.http.post("/v1/nodes/small/report", content=_body(beat), headers=small | JSON)
    assert again.status_code == 200 and again.json() == {
        "node": "small",
        "live": True,
        "send_host": False,
        "approved": reply["approved"],
    }
    # The operator changes small's approved slots: within a flush the agent's next report gets them.
    documents = list(yaml.safe_load_all(api_fleet()))
    cluster = next(d for d in documents if d["kind"] == "InferenceCluster")
    small_node = next(n for n in cluster["spec"]["nodePools"][0]["nodes"] if n["name"] == "small")
    small_node["slots"][1]["vcpus"] = 8
    applied = await stack.http.put(
        "/v1/fleet", content=json.dumps({"kind": "List", "items": documents}), headers=stack.admin
    )
    assert applied.status_code == 200, applied.text
    await asyncio.sleep(1.1)  # past the flush interval: this heartbeat's flush sees the changed approval
    await stack.http.post("/v1/nodes/small/report", content=_body(beat), headers=small | JSON)
    fresh = (await stack.http.post("/v1/nodes/small/report", content=_body(beat), headers=small | JSON)).json()
    assert fresh["approved"] != reply["approved"] and [s["vcpus"] for s in fresh["slots"]] == [1, 8]

    # A topology the control plane has never seen must come with its host.
    unknown = NodeReport(agent=AGENT, topology="feedfacecafebeef", approved=reply["approved"])
    asked = await stack.http.post("/v1/nodes/small/report", content=_body(unknown), headers=small | JSON)
    assert asked.json()["send_host"] is True


async def test_malformed_reports_are_422_and_unknown_nodes_404(stack: Stack) -> None:
    bad = await stack.http.post("/v1/nodes/small/report", json={"agent": {"version": "x"}}, headers=stack.admin)
    assert bad.status_code == 422 and bad.json()["error"]["code"]
    report = NodeReport(agent=AGENT, topology="0" * 16)
    missing = await stack.http.post("/v1/nodes/nope/report", content=_body(report), headers=stack.admin | JSON)
    assert missing.status_code == 404
    lying = {"agent": AGENT.model_dump(), "topology": "0" * 16, "host": {"gpus": []}}
    mismatch = await stack.http.post("/v1/nodes/small/report", json=lying, headers=stack.admin)
    assert mismatch.status_code == 422 and mismatch.json()["error"]["code"] == "topology_mismatch"


async def test_text_postgresql_cannot_store_is_422_not_500(stack: Stack) -> None:
    """Found by schemathesis: a NUL, or a lone surrogate escaped in JSON, in the reported host."""
    for hostname in ("a\\u0000b", "\\ud800"):
        body = '{"agent": {"version": "x", "interval_seconds": 30}, "topology": "0", "host": {"hostname": "%s"}}'
        answer = await stack.http.post("/v1/nodes/small/report", content=body % hostname, headers=stack.admin | JSON)
        assert answer.status_code == 422, answer.text


async def test_a_revoked_node_token_is_refused_within_five_seconds_even_for_steady_heartbeats(
    stack: Stack, tmp_path: Path
) -> None:
    """The heartbeat path answers from memory (api/steady_reports.py); revocation must reach it all the same."""
    async with stack.lab.sessions.begin() as session:
        token = await create_token(session, "node", node="small", label="test")
    small = bearer(token)
    host = discover_host(sysfs_tree.gpu_on_nvidia().write(tmp_path))
    first = await stack.http.post(
        "/v1/nodes/small/report",
        content=_body(NodeReport(agent=AGENT, topology=host.topology_hash(), host=host)),
        headers=small | JSON,
    )
    beat = _body(NodeReport(agent=AGENT, topology=host.topology_hash(), approved=first.json()["approved"]))
    assert (await stack.http.post("/v1/nodes/small/report", content=beat, headers=small | JSON)).status_code == 200
    async with stack.lab.sessions.begin() as session:
        assert await revoke_tokens(session, node="small")
    revoked_at = asyncio.get_running_loop().time()
    while True:
        answer = await stack.http.post("/v1/nodes/small/report", content=beat, headers=small | JSON)
        if answer.status_code == 401:
            assert answer.json()["error"]["code"] == "token_revoked"
            break
        assert answer.status_code == 200, answer.text
        assert asyncio.get_running_loop().time() - revoked_at < 5, "the revoked node token still reported after 5 s"
        await asyncio.sleep(0.1)


async def test_a_report_that_is_not_a_heartbeat_asks_for_a_walk_of_the_queues(stack: Stack, tmp_path: Path) -> None:
    """An agent that (re)starts or reports a changed host may have brought capacity back: the API asks the control
    plane for an admission pass (the `queue-walk/<control queue>` workflow, in the Temporal UI with its reason)."""
    small = await _node_token(stack, "small")
    host = discover_host(sysfs_tree.gpu_on_nvidia().write(tmp_path))
    report = NodeReport(agent=AGENT, topology=host.topology_hash(), host=host)
    assert (await stack.http.post("/v1/nodes/small/report", content=_body(report), headers=small | JSON)).is_success

    walk = stack.lab.starter.get_workflow_handle(f"queue-walk/{stack.lab.queues.control}")
    for _ in range(100):  # the ask is sent after the answer, best effort: give it a moment to reach Temporal
        try:
            await walk.describe()
            break
        except RPCError:
            await asyncio.sleep(0.1)
    assert await walk.result() >= 1
    reasons = [
        e.workflow_execution_signaled_event_attributes.input.payloads[0].data
        for e in (await walk.fetch_history()).events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    assert b'"node small reported"' in reasons
