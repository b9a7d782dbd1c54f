"""Each GPU's state, per pool (`GET /v1/capacity` `states`) and per node (`GET /v1/nodes` `slots`), and who may
read which holder: an operator every allocation, a tenant its own by id and another tenant's only as in use."""

from __future__ import annotations

from typing import Any

from tests.api.stack import Stack

POOL = "lab-1/slices"


def _pool(report: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in report["pools"] if p["pool"] == POOL)


def _held(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [slot for node in nodes for slot in node["slots"] if slot["state"] == "held"]


async def test_capacity_counts_each_gpu_once_by_state_and_nodes_show_whose_it_is(stack: Stack) -> None:
    mine = await stack.create(2, who=stack.acme)
    await stack.wait_for(mine, "active")

    pool = _pool((await stack.http.get("/v1/capacity", headers=stack.admin)).json())
    assert sum(pool["states"].values()) == pool["gpus"] == 7
    assert pool["states"]["held"] == 2
    assert pool["states"]["free"] == pool["raw_free_gpus"]

    admin = (await stack.http.get("/v1/nodes", params={"pool": POOL}, headers=stack.admin)).json()["nodes"]
    assert [n["name"] for n in admin] == ["big", "slow", "small"]
    assert {slot["allocation"] for slot in _held(admin)} == {mine}
    assert all(node["slots"] and len(node["slots"]) == node["gpus"] for node in admin)
    assert sum(node["allocations"] for node in admin) == 1

    own = (await stack.http.get("/v1/nodes", params={"pool": POOL}, headers=stack.acme)).json()["nodes"]
    assert {slot["allocation"] for slot in _held(own)} == {mine}
    other = (await stack.http.get("/v1/nodes", params={"pool": POOL}, headers=stack.globex)).json()["nodes"]
    assert [(s["in_use"], s["allocation"]) for s in _held(other)] == [(True, None), (True, None)]
    node = next(n for n in other if _held([n]))["name"]
    one = (await stack.http.get(f"/v1/nodes/{node}", headers=stack.globex)).json()
    assert [s["allocation"] for s in _held([one])] == [None, None]
    assert one["signals"] == [] and one["agent"].get("topology") is None


async def test_the_pool_filter_takes_cluster_slash_pool(stack: Stack) -> None:
    other = await stack.http.get("/v1/nodes", params={"pool": "lab-1/none"}, headers=stack.admin)
    assert other.status_code == 200 and other.json()["nodes"] == []
    bad = await stack.http.get("/v1/nodes", params={"pool": "no-slash"}, headers=stack.admin)
    assert bad.status_code == 422


async def test_cordoned_free_gpus_are_off_and_a_tenant_cannot_cordon(stack: Stack) -> None:
    assert (await stack.http.post("/v1/nodes/small/cordon", headers=stack.acme)).status_code == 403
    cordoned = (await stack.http.post("/v1/nodes/small/cordon", headers=stack.admin)).json()
    assert cordoned["status"] == "CORDONED"
    assert [slot["state"] for slot in cordoned["slots"]] == ["off", "off"]
    pool = _pool((await stack.http.get("/v1/capacity", headers=stack.admin)).json())
    assert pool["states"]["off"] >= 2
    healthy = await stack.http.get("/v1/nodes", params={"out_of_placement": "true"}, headers=stack.admin)
    assert healthy.json()["nodes"] == []
