"""`POST /v1/explain` and `GET /v1/capacity`: the scheduler's answers over what PostgreSQL holds now."""

from __future__ import annotations

from sqlalchemy import func, select

from store.models import AllocationRow
from tests.api.stack import Stack


async def test_explain_places_without_side_effects(stack: Stack) -> None:
    before = await stack.lab.slot_states()
    response = await stack.http.post("/v1/explain", json={"gpu_count": 2, "gpu_product": "H200"}, headers=stack.acme)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["placed"] is True and result["refusal"] is None
    assert result["explanation"]["summary"] == (
        "2 H200 GPU slices fit on node small in pool lab-1/slices (lab), with 1 alternate"
    )
    assert [level["level"] for level in result["explanation"]["levels"]] == [
        "tenant",
        "region",
        "pool",
        "node",
        "bundle",
    ]
    node_level = result["explanation"]["levels"][3]
    assert (node_level["considered"], node_level["passed"], node_level["dropped"]) == (
        3,
        2,
        {"node_too_small": 1},
    )
    assert node_level["items"] is None
    assert [c["node"] for c in result["candidates"]] == ["small", "big"]
    assert [b["slot_index"] for b in result["plan"]["bundles"]] == [0, 1]
    assert await stack.lab.slot_states() == before
    async with stack.lab.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AllocationRow)) == 0

    detailed = await stack.http.post("/v1/explain?detail=true", json={"gpu_count": 2}, headers=stack.acme)
    items = detailed.json()["explanation"]["levels"][3]["items"]
    assert {item["name"]: item["reason"] for item in items} == {
        "big": None,
        "small": None,
        "slow": "node_too_small",
    }


async def test_explain_refusals_say_why_and_are_counted(stack: Stack) -> None:
    too_big = await stack.http.post("/v1/explain", json={"gpu_count": 8}, headers=stack.acme)
    assert too_big.status_code == 200
    assert too_big.json()["placed"] is False
    assert too_big.json()["refusal"]["code"] == "no_compatible_bundles"
    # globex's quota is 2 GPUs; the tenant's own policy applies to its token.
    over_quota = await stack.http.post("/v1/explain", json={"gpu_count": 4}, headers=stack.globex)
    assert over_quota.json()["refusal"]["code"] == "quota_exceeded"
    # An admin without a tenant asks as the operator: no quota applies.
    operator = await stack.http.post("/v1/explain", json={"gpu_count": 4}, headers=stack.admin)
    assert operator.json()["placed"] is True
    metrics = (await stack.http.get("/metrics")).text
    assert 'berth_explain_refusals_total{reason="no_compatible_bundles"} 1.0' in metrics
    assert 'berth_explain_refusals_total{reason="quota_exceeded"} 1.0' in metrics


async def test_capacity_counts_raw_free_and_schedulable_slices(stack: Stack) -> None:
    allocation_id = await stack.create(2)
    await stack.wait_for(allocation_id, "active")
    response = await stack.http.get("/v1/capacity", params={"region": "lab", "gpu_product": "h200"}, headers=stack.acme)
    assert response.status_code == 200
    [pool] = response.json()["pools"]
    assert (pool["pool"], pool["nodes"], pool["gpus"], pool["raw_free_gpus"]) == ("lab-1/slices", 3, 7, 5)
    assert pool["slices"] == {"1": 5, "2": 2, "4": 1, "8": 0}
    assert pool["baremetal_nodes"] == 0
    elsewhere = await stack.http.get("/v1/capacity", params={"region": "mars"}, headers=stack.acme)
    assert elsewhere.json() == {"pools": []}
