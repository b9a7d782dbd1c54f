"""`/v1/audit` as an operator uses it: run an audit, read the findings, repair, see it in the metrics; tenants are
refused and a control plane that is down is a 503 naming what is down (tests/api/stack.py: hosts slow, small, big)."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.client import Client

from agent.drivers import VmRecord
from api.temporal import TemporalTimeouts
from contracts.task_queues import Queues
from tests.api.stack import Stack, app_for, http_client


def plant_orphan_vm(stack: Stack, node: str = "big", allocation: str = "stray") -> None:
    record = VmRecord(
        vm_id=f"vm-{allocation}", allocation_id=allocation, slot_indexes=[3], created_at=datetime.now(UTC).timestamp()
    )
    (stack.lab.home / "nodes" / node / "vms" / f"{allocation}.json").write_text(record.model_dump_json())


async def test_audit_finds_repairs_and_counts(stack: Stack) -> None:
    empty = await stack.http.get("/v1/audit", headers=stack.admin)
    assert empty.status_code == 200 and empty.json() == {"ran": False, "counts": {}, "report": None}
    plant_orphan_vm(stack)

    found = await stack.http.post("/v1/audit", json={}, headers=stack.admin)
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["counts"] == {"orphan_vm": 1}
    [finding] = body["report"]["findings"]
    assert (finding["kind"], finding["node"], finding["allocation_id"], finding["repair"]) == (
        "orphan_vm",
        "big",
        "stray",
        "destroy_vm",
    )
    assert "accounted for by no active claim" in finding["message"]
    assert finding["blocked"].startswith("grace period")
    assert body["report"]["nodes_checked"] == ["big", "slow", "small"]
    assert (await stack.http.get("/v1/audit", headers=stack.admin)).json() == body  # the latest, from PostgreSQL

    repaired = (await stack.http.post("/v1/audit", json={"repair": True}, headers=stack.admin)).json()
    assert [(r["kind"], r["action"], r["outcome"]) for r in repaired["report"]["repairs"]] == [
        ("orphan_vm", "destroy_vm", "done")
    ]
    assert repaired["report"]["findings"][0]["first_seen"] == finding["first_seen"]
    assert not (stack.lab.home / "nodes" / "big" / "vms" / "stray.json").exists()
    assert (await stack.http.post("/v1/audit", headers=stack.admin)).json()["counts"] == {}

    metrics = (await stack.http.get("/metrics")).text
    assert 'berth_audit_findings{kind="orphan_vm"} 0.0' in metrics
    assert 'berth_audit_repairs_total{kind="orphan_vm",outcome="done"} 1.0' in metrics


async def test_tenants_are_refused_and_bad_bodies_are_422(stack: Stack) -> None:
    for method in ("GET", "POST"):
        response = await stack.http.request(method, "/v1/audit", headers=stack.acme)
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    bad = await stack.http.post("/v1/audit", json={"repair": "perhaps"}, headers=stack.admin)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"


async def test_no_control_worker_or_no_temporal_is_503(stack: Stack, temporal_client: Client) -> None:
    nobody = Queues(control=f"{stack.lab.queues.control}.unpolled", node_prefix=stack.lab.queues.node_prefix)
    async with http_client(app_for(stack.lab.sessions, temporal_client, nobody)) as http:
        response = await http.post("/v1/audit", json={"repair": True}, headers=stack.admin)
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_control_worker"
        assert (await http.get("/v1/audit", headers=stack.admin)).status_code == 200  # reads need no Temporal
    down = app_for(
        stack.lab.sessions,
        None,
        stack.lab.queues,
        TemporalTimeouts(connect_seconds=1.0),
        temporal_address="127.0.0.1:9",
    )
    async with http_client(down) as http:
        response = await http.post("/v1/audit", json={}, headers=stack.admin)
        assert response.status_code == 503 and response.json()["error"]["code"] == "temporal_unavailable"
