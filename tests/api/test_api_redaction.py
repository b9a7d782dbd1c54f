"""What a tenant may learn through the API about everything that is not its own: explain and
pinning never name other tenants' allocations, and a tenant does not see the whole fleet.

- Another tenant's allocation ids: a GPU held by globex, pinned by acme through explain (with and without detail)
  and through a create, is "claimed by another allocation" everywhere acme looks (the refusal, the bundle level's
  per-slot detail, its allocation's failure reason, attempts and events); an admin's explain names the holder in
  `holders`.
- The fleet: a tenant's capacity, explain and 422 choices cover only the regions its policy admits (allowed
  regions, required jurisdiction), their pools and nodes; a region or node outside them is answered exactly as
  one that does not exist. Admins see all.

The lab (tests/api/stack.py): region `lab`, pool `lab-1/slices` with nodes `slow` (1 GPU), `small` (2), `big` (4,
GPUs 0000:10:00.0 to 0000:13:00.0); tenants `acme` and `globex`.
"""

from __future__ import annotations

from typing import Any

import httpx
import yaml

from tests.api.stack import Stack, api_fleet, bearer
from tests.workflows.lab import lab_fleet

BIG_FIRST_GPU = {"nodes": ["big"], "gpus": ["0000:10:00.0"]}


async def _post(stack: Stack, path: str, body: dict[str, Any], who: dict[str, str], **params: Any) -> httpx.Response:
    response = await stack.http.post(path, json=body, headers=who, params=params)
    assert response.status_code in (200, 202), response.text
    return response


async def test_a_tenant_pinning_another_tenants_gpu_never_sees_its_allocation_id(stack: Stack) -> None:
    theirs = (await _post(stack, "/v1/allocations", {"gpu_count": 1, **BIG_FIRST_GPU}, stack.globex)).json()["id"]
    await stack.wait_for(theirs, "active")
    claimed = "big cannot give its pinned GPUs: GPU 0000:10:00.0 is claimed by another allocation"

    for detail in ("false", "true"):
        explained = await _post(stack, "/v1/explain", {"gpu_count": 1, **BIG_FIRST_GPU}, stack.acme, detail=detail)
        assert theirs not in explained.text
        result = explained.json()
        assert result["placed"] is False and result["holders"] is None
        assert result["refusal"] == {
            "code": "pinned_nodes_unavailable",
            "message": f"no pinned node can take 1 GPU slice: {claimed}",
        }

    # Pinned to the node alone, acme is placed on big's free GPUs; the bundle level details every slot of big.
    explained = await _post(stack, "/v1/explain", {"gpu_count": 1, "nodes": ["big"]}, stack.acme, detail="true")
    assert theirs not in explained.text
    bundles = explained.json()["explanation"]["levels"][-1]
    held = [item for item in bundles["items"] if item["reason"] == "slot_claimed"]
    assert [item["detail"] for item in held] == ["index 0, NUMA 0, GPU 0000:10:00.0, claimed, valid"]

    refused = await stack.wait_for(
        (await _post(stack, "/v1/allocations", {"gpu_count": 1, **BIG_FIRST_GPU}, stack.acme)).json()["id"], "failed"
    )
    assert claimed in refused["failure_reason"]
    seen = await stack.http.get(f"/v1/allocations/{refused['id']}", headers=stack.acme)
    listed = await stack.http.get("/v1/allocations", headers=stack.acme)
    assert seen.status_code == listed.status_code == 200
    assert theirs not in seen.text and theirs not in listed.text

    # The operator's explain says who holds big's first GPU.
    admin = await _post(stack, "/v1/explain", {"gpu_count": 1, **BIG_FIRST_GPU}, stack.admin, detail="true")
    assert admin.json()["refusal"]["message"] == f"no pinned node can take 1 GPU slice: {claimed}"
    assert admin.json()["holders"] == [
        {
            "node": "big",
            "slot_id": held[0]["name"],
            "slot_index": 0,
            "gpu_pci": "0000:10:00.0",
            "state": "claimed",
            "allocation": theirs,
        },
    ]


def _wider_fleet() -> str:
    """The lab, plus region `offlimits` (jurisdiction `eu`, pool `offlimits-1/slices`, node `remote`), with globex
    allowed only `lab` and a new tenant `initech` that must stay in `eu`."""
    documents = list(yaml.safe_load_all(api_fleet()))
    for document in documents:
        if document["kind"] == "Tenant" and document["metadata"]["name"] == "globex":
            document["spec"]["allowedRegions"] = ["lab"]
    for document in yaml.safe_load_all(lab_fleet({"remote": {"gpus": 2}})):
        if document["kind"] == "Region":
            document["metadata"]["name"] = "offlimits"
            document["spec"]["jurisdiction"] = "eu"
            documents.append(document)
        elif document["kind"] == "InferenceCluster":
            document["metadata"]["name"] = "offlimits-1"
            document["spec"]["region"] = "offlimits"
            for slot in document["spec"]["nodePools"][0]["nodes"][0]["slots"]:
                slot["mac"] = f"52:54:00:7f:00:{slot['index']:02x}"
                slot["privateIp"] = f"10.0.127.{10 + slot['index']}"
            documents.append(document)
    documents.append(
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": "initech"},
            "spec": {"gpuQuota": 8, "requiredJurisdiction": "eu"},
        }
    )
    return yaml.safe_dump_all(documents, sort_keys=False)


async def _pools(stack: Stack, who: dict[str, str]) -> list[tuple[str, str]]:
    response = await stack.http.get("/v1/capacity", headers=who)
    assert response.status_code == 200, response.text
    return [(pool["region"], pool["pool"]) for pool in response.json()["pools"]]


async def _unknown(stack: Stack, body: dict[str, Any], who: dict[str, str]) -> dict[str, Any]:
    """The 422 of a create and of an explain naming `body`'s region or node: the same error for both."""
    errors = []
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json={"gpu_count": 1, **body}, headers=who)
        assert response.status_code == 422, response.text
        errors.append(response.json()["error"])
    assert errors[0] == errors[1]
    return errors[0]


async def test_a_tenant_sees_only_the_regions_pools_and_nodes_its_policy_lets_it_use(stack: Stack) -> None:
    applied = await stack.http.put("/v1/fleet", content=_wider_fleet(), headers=stack.admin)
    assert applied.status_code == 200, applied.text
    initech = bearer(applied.json()["tenant_tokens"]["initech"])
    everything = [("lab", "lab-1/slices"), ("offlimits", "offlimits-1/slices")]
    assert await _pools(stack, stack.admin) == everything
    assert await _pools(stack, stack.acme) == everything  # acme's policy admits every region
    assert await _pools(stack, stack.globex) == [("lab", "lab-1/slices")]  # allowed regions: lab
    assert await _pools(stack, initech) == [("offlimits", "offlimits-1/slices")]  # jurisdiction eu
    filtered = await stack.http.get("/v1/capacity", params={"region": "offlimits"}, headers=stack.globex)
    assert filtered.status_code == 200 and filtered.json() == {"pools": []}

    # Explain weighs only the regions the tenant may use, so it neither names nor counts the others.
    explained = await _post(stack, "/v1/explain", {"gpu_count": 1}, stack.globex, detail="true")
    regions = explained.json()["explanation"]["levels"][1]
    assert (regions["level"], regions["considered"], [item["name"] for item in regions["items"]]) == (
        "region",
        1,
        ["lab"],
    )
    assert "offlimits" not in explained.text and "remote" not in explained.text
    operator = await _post(stack, "/v1/explain", {"gpu_count": 1, "tenant": "globex"}, stack.admin, detail="true")
    assert operator.json()["explanation"]["levels"][1]["dropped"] == {"region_not_allowed": 1}

    # A node or region the tenant may not use is answered exactly as one that does not exist, with its own choices,
    # in words true of both: it is not in the regions the tenant may use.
    remote = await _unknown(stack, {"nodes": ["remote"]}, stack.globex)
    assert remote == await _unknown(stack, {"nodes": ["nowhere"]}, stack.globex) | {
        "message": "no node 'remote' in the regions your tenant may use; available to you: big, slow, small",
        "details": [{"field": "body.nodes[0]", "value": "remote", "choices": ["big", "slow", "small"]}],
    }
    assert remote["code"] == "unknown_node"
    region = await _unknown(stack, {"region": "offlimits"}, stack.globex)
    assert (region["code"], region["details"]) == (
        "unknown_region",
        [{"field": "body.region", "value": "offlimits", "choices": ["lab"]}],
    )
    assert (await _unknown(stack, {"nodes": ["big"]}, initech))["details"][0]["choices"] == ["remote"]
    admin = await _unknown(stack, {"nodes": ["nowhere"], "tenant": "globex"}, stack.admin)
    assert admin["details"][0]["choices"] == ["big", "remote", "slow", "small"]
