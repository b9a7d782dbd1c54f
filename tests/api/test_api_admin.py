"""Admin routes: applying a fleet file through the API, listing nodes, cordoning."""

from __future__ import annotations

import json

import yaml
from sqlalchemy import update

from store.models import SlotRow
from tests.api.stack import Stack, api_fleet, bearer

INITECH = {
    "apiVersion": "berth.dev/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "initech"},
    "spec": {"gpuQuota": 8},
}


async def test_put_fleet_applies_yaml_and_issues_tokens_to_new_tenants(stack: Stack) -> None:
    same = await stack.http.put(
        "/v1/fleet", content=api_fleet(), headers=stack.admin | {"Content-Type": "application/yaml"}
    )
    assert same.status_code == 200, same.text
    assert same.json()["changes"] == [] and same.json()["tenant_tokens"] == {}
    assert same.json()["summary"].startswith("no changes")

    grown = api_fleet() + "---\n" + yaml.safe_dump(INITECH)
    response = await stack.http.put("/v1/fleet", content=grown, headers=stack.admin)
    assert response.status_code == 200
    assert response.json()["changes"] == [{"kind": "Tenant", "name": "initech", "action": "created"}]
    token = response.json()["tenant_tokens"]["initech"]
    mine = await stack.http.get("/v1/allocations", headers=bearer(token))
    assert mine.status_code == 200 and mine.json() == {"allocations": [], "next_cursor": None}


async def test_put_fleet_accepts_json(stack: Stack) -> None:
    response = await stack.http.put("/v1/fleet", json=INITECH, headers=stack.admin)
    assert response.status_code == 200
    assert {"kind": "Tenant", "name": "initech", "action": "created"} in response.json()["changes"]


async def test_an_invalid_fleet_file_is_400_with_every_problem(stack: Stack) -> None:
    broken = [
        {"apiVersion": "berth.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "x"}, "spec": {"gpuQuota": -1}},
        {"apiVersion": "berth.dev/v1alpha1", "kind": "Regoin", "metadata": {"name": "y"}},
    ]
    response = await stack.http.put("/v1/fleet", content=yaml.safe_dump_all(broken), headers=stack.admin)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_fleet" and error["message"].startswith("the fleet file has 2 problems")
    assert [(p["document"], p.get("path")) for p in error["details"]] == [(1, "spec.gpuQuota"), (2, "kind")]

    not_yaml = await stack.http.put("/v1/fleet", content=b"kind: [unclosed", headers=stack.admin)
    assert not_yaml.status_code == 400 and "not valid YAML" in not_yaml.json()["error"]["message"]
    not_text = await stack.http.put("/v1/fleet", content=b"\xff\xfe", headers=stack.admin)
    assert not_text.status_code == 400 and "UTF-8" in not_text.json()["error"]["message"]


async def test_pruning_capacity_that_is_held_is_409_and_writes_nothing(stack: Stack) -> None:
    allocation_id = await stack.create(2)
    await stack.wait_for(allocation_id, "active")  # on `small`
    documents = list(yaml.safe_load_all(api_fleet()))
    cluster = next(d for d in documents if d["kind"] == "InferenceCluster")
    pool = cluster["spec"]["nodePools"][0]
    pool["nodes"] = [n for n in pool["nodes"] if n["name"] != "small"]
    response = await stack.http.put(
        "/v1/fleet?prune=true", content=json.dumps({"kind": "List", "items": documents}), headers=stack.admin
    )
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "apply_refused"
    assert "node small has 2 active claim(s)" in response.json()["error"]["message"]
    nodes = (await stack.http.get("/v1/nodes", headers=stack.admin)).json()["nodes"]
    assert "small" in [n["name"] for n in nodes]


async def test_nodes_list_and_cordon(stack: Stack) -> None:
    allocation_id = await stack.create(2)
    await stack.wait_for(allocation_id, "active")
    nodes = (await stack.http.get("/v1/nodes", headers=stack.admin)).json()["nodes"]
    small = next(n for n in nodes if n["name"] == "small")
    agent = small.pop("agent")
    assert small == {
        "name": "small",
        "cluster": "lab-1",
        "pool": "lab-1/slices",
        "region": "lab",
        "shape": "gpu_slice",
        "gpu_product": "H200",
        "status": "READY",
        "declared_status": "READY",
        "gpus": 2,
        "available_slots": 0,
        "reserved_slots": 2,
        "quarantined_slots": 0,
        "labels": {},
        "validated_gpus": 2,
        "compatible_gpus": 2,
        "invalid_slots": [],
        "quarantined": [],
        "unhealthy": [],
        "signals": [],  # signals: `GET /v1/nodes/{node}`
        "slots": [
            {
                "index": i,
                "gpu_pci": f"0000:{0x10 + i:02x}:00.0",
                "state": "held",
                "in_use": True,
                "allocation": allocation_id,
            }
            for i in range(2)
        ],
        "allocations": 1,
    }
    assert agent["state"] == "live" and agent["seen_at"] and agent["topology"]

    cordoned = await stack.http.post("/v1/nodes/big/cordon", headers=stack.admin)
    assert cordoned.status_code == 200
    assert (cordoned.json()["status"], cordoned.json()["declared_status"]) == ("CORDONED", "READY")
    assert (await stack.http.post("/v1/nodes/big/cordon", headers=stack.admin)).status_code == 200
    listed = await stack.http.get("/v1/nodes", params={"status": "CORDONED"}, headers=stack.admin)
    assert [n["name"] for n in listed.json()["nodes"]] == ["big"]
    # The scheduler sees it at once: nothing is left for 4 GPUs.
    explained = await stack.http.post("/v1/explain", json={"gpu_count": 4}, headers=stack.acme)
    assert explained.json()["refusal"]["code"] == "insufficient_capacity"

    uncordoned = await stack.http.post("/v1/nodes/big/uncordon", headers=stack.admin)
    assert uncordoned.json()["status"] == "READY"
    assert (await stack.http.post("/v1/explain", json={"gpu_count": 4}, headers=stack.acme)).json()["placed"]

    missing = await stack.http.post("/v1/nodes/nope/cordon", headers=stack.admin)
    assert missing.status_code == 404 and missing.json()["error"]["details"] == {"kind": "node", "name": "nope"}


async def test_nodes_show_quarantined_slots_with_their_reason(stack: Stack) -> None:
    async with stack.lab.sessions.begin() as session:
        await session.execute(
            update(SlotRow)
            .where(SlotRow.node_id == "big", SlotRow.slot_index == 1)
            .values(state="quarantined", quarantine_reason="wipe not confirmed: agent_unreachable")
        )
    for path in ("/v1/nodes", "/v1/nodes/big"):
        answer = await stack.http.get(path, headers=stack.admin)
        assert answer.status_code == 200, answer.text
        big = answer.json() if path.endswith("big") else next(n for n in answer.json()["nodes"] if n["name"] == "big")
        assert big["quarantined_slots"] == 1 and big["available_slots"] == 3
        assert big["quarantined"] == [{"index": 1, "reason": "wipe not confirmed: agent_unreachable"}]


async def test_a_quarantine_names_its_allocation_only_to_whom_may_see_it(stack: Stack) -> None:
    """A quarantine's reason begins with the allocation whose failure left the slot unwiped, as the claims write it;
    another tenant reading the node sees why, never whose."""
    theirs = await stack.create(1, who=stack.acme)
    async with stack.lab.sessions.begin() as session:
        await session.execute(
            update(SlotRow)
            .where(SlotRow.node_id == "big", SlotRow.slot_index == 1)
            .values(state="quarantined", quarantine_reason=f"{theirs}: wipe not confirmed: agent_unreachable")
        )
    seen = {}
    for who, headers in (("admin", stack.admin), ("acme", stack.acme), ("globex", stack.globex)):
        for path in ("/v1/nodes", "/v1/nodes/big"):
            answer = await stack.http.get(path, headers=headers)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            big = body if path.endswith("big") else next(n for n in body["nodes"] if n["name"] == "big")
            seen[who, path] = big["quarantined"]
            if who == "globex":
                assert theirs not in answer.text, answer.text
    assert seen["admin", "/v1/nodes/big"] == [
        {"index": 1, "reason": f"{theirs}: wipe not confirmed: agent_unreachable"}
    ]
    assert seen["acme", "/v1/nodes/big"] == seen["admin", "/v1/nodes/big"]  # its own allocation
    assert seen["globex", "/v1/nodes"] == [{"index": 1, "reason": "wipe not confirmed: agent_unreachable"}]
