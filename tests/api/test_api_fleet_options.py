"""`PUT /v1/fleet`'s options, what `berth apply` did client-side: a dry run that validates and counts and writes
nothing, several files sent as one multi-document stream (JSON among YAML), a Kubernetes NodeList adopted as a
cluster with the nodes no pool took reported, and how many running deployments were told to re-plan."""

from __future__ import annotations

import json

import yaml

from tests.api.stack import Stack, api_fleet

INITECH = {
    "apiVersion": "berth.dev/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "initech"},
    "spec": {"gpuQuota": 4},
}
GFD = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559"}


def _node(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


NODES = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [_node("gpu-a", **GFD), _node("gpu-b", **GFD), _node("gpu-c", **{"nvidia.com/gpu.count": "8"})],
}


def _files(*texts: str) -> str:
    """Several files as the CLI sends them: each file's text as it is, `---` between them."""
    return "\n---\n".join(texts)


async def test_a_dry_run_validates_and_counts_and_writes_nothing(stack: Stack) -> None:
    grown = _files(api_fleet(), json.dumps(INITECH, indent=2))
    dry = await stack.http.put("/v1/fleet", params={"dry_run": "true"}, content=grown, headers=stack.admin)
    assert dry.status_code == 200, dry.text
    body = dry.json()
    assert body["dry_run"] is True and body["changes"] == [] and body["tenant_tokens"] == {}
    assert body["counts"] == {"regions": 1, "tenants": 3, "classes": 1, "clusters": 1, "nodes": 3}
    assert body["summary"] == "valid: 1 regions, 3 tenants, 1 classes, 1 clusters, 3 nodes"

    applied = await stack.http.put("/v1/fleet", content=grown, headers=stack.admin)  # the dry run wrote nothing
    assert applied.status_code == 200, applied.text
    assert applied.json()["dry_run"] is False and list(applied.json()["tenant_tokens"]) == ["initech"]
    assert ("created", "Tenant", "initech") in {(c["action"], c["kind"], c["name"]) for c in applied.json()["changes"]}
    assert applied.json()["deployments_told"] == 0  # no deployment runs in this lab

    # A dry run refuses what an apply would: a broken file (400) and documents that are not inventory (409).
    broken = await stack.http.put("/v1/fleet?dry_run=true", content="kind: [unclosed", headers=stack.admin)
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_fleet"
    plan = {"apiVersion": "modelplane.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "m"}, "spec": {}}
    refused = await stack.http.put("/v1/fleet?dry_run=true", content=yaml.safe_dump(plan), headers=stack.admin)
    assert refused.status_code in (400, 409), refused.text


async def test_a_node_list_becomes_a_cluster_and_its_unlabelled_nodes_are_reported(stack: Stack) -> None:
    body = _files(api_fleet(), yaml.safe_dump(NODES))
    refused = await stack.http.put("/v1/fleet", content=body, headers=stack.admin)
    assert refused.status_code == 400, refused.text
    assert "a NodeList needs --cluster NAME" in refused.json()["error"]["message"]
    unknown = await stack.http.put(
        "/v1/fleet", params={"cluster": "byo-1", "region": "mars"}, content=body, headers=stack.admin
    )
    assert unknown.status_code == 400 and "is named by --region but not defined" in unknown.json()["error"]["message"]

    params = {"cluster": "byo-1", "region": "lab", "capabilities": "vllm, sglang"}
    dry = await stack.http.put("/v1/fleet", params={**params, "dry_run": "true"}, content=body, headers=stack.admin)
    assert dry.status_code == 200, dry.text
    assert dry.json()["counts"]["clusters"] == 2  # a Kubernetes pool counts its nodes, it does not list them
    assert [s["name"] for s in dry.json()["skipped"]] == ["gpu-c"]

    applied = await stack.http.put("/v1/fleet", params=params, content=body, headers=stack.admin)
    assert applied.status_code == 200, applied.text
    answer = applied.json()
    assert [(s["name"], "nvidia.com/gpu" in s["reason"]) for s in answer["skipped"]] == [("gpu-c", True)]
    created = {(c["kind"], c["name"]) for c in answer["changes"] if c["action"] == "created"}
    assert ("InferenceCluster", "byo-1") in created
    assert [name for kind, name in created if kind == "NodePool"] == ["byo-1/nvidia-h100-80gb-hbm3-8x81559mi"]
    assert answer["deployments_told"] == 0  # no deployment runs in this lab
