"""The deployments' live path over HTTP against the real stack (PostgreSQL, Temporal, a control worker; simulated
clusters): namespaced deployments, ModelCaches applied with the fleet and honoured by placement, and an autoscaling
pool's maxNodeCount counted as `berth plan` counts it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import text
from temporalio.client import Client

from api.app import create_app
from config.settings import Settings
from store.tokens import create_token
from tests.api.stack import FAST_CALLS, bearer, control_worker_seen, http_client
from tests.workflows.deployment_lab import FAST, DeploymentLab, deployment, deployment_lab, k8s_fleet

CACHE = {
    "apiVersion": "modelplane.ai/v1alpha1",
    "kind": "ModelCache",
    "metadata": {"name": "llama-weights", "namespace": "prod"},
    "spec": {"source": "HuggingFace", "huggingFace": {"repo": "meta-llama/Llama-3.1-8B", "sizeGiB": 16}},
    "status": {"clusters": [{"name": "east", "phase": "Hydrating"}, {"name": "west", "phase": "Ready"}]},
}


class Api:
    def __init__(self, http: httpx.AsyncClient, lab: DeploymentLab, admin: dict[str, str], fleet: str) -> None:
        self.http, self.lab, self.admin, self.fleet = http, lab, admin, fleet

    async def wait_for(self, path: str, check: Any, timeout: float = 30) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            response = await self.http.get(path, headers=self.admin)
            if response.status_code == 200 and check(body := response.json()):
                return body
            assert asyncio.get_running_loop().time() < deadline, response.text
            await asyncio.sleep(0.1)

    async def gone(self, path: str, timeout: float = 30) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while (await self.http.get(path, headers=self.admin)).status_code != 404:
            assert asyncio.get_running_loop().time() < deadline, path
            await asyncio.sleep(0.1)

    async def put_fleet(self, *documents: dict[str, Any], prune: bool = False) -> dict[str, Any]:
        body = self.fleet + "".join("---\n" + yaml.safe_dump(d) for d in documents)
        response = await self.http.put(
            "/v1/fleet",
            content=body,
            params={"prune": prune},
            headers={**self.admin, "Content-Type": "application/yaml"},
        )
        assert response.status_code == 200, response.text
        return response.json()

    async def ledger(self) -> list[tuple[str, str, str, int]]:
        """(namespace, replica, cluster, nodes) of every ledger row."""
        async with self.lab.sessions() as session:
            rows = await session.execute(
                text(
                    "SELECT u.namespace, u.replica, p.cluster, u.nodes FROM replica_pool_usage u "
                    "JOIN pools p ON p.id = u.pool_id ORDER BY u.namespace, u.replica"
                )
            )
            return [tuple(r) for r in rows]


@pytest.fixture
def fleet_text() -> str:
    return k8s_fleet({"east": 2, "west": 2})


@pytest.fixture
async def api(temporal_client: Client, sessions, tmp_path: Path, fleet_text: str) -> AsyncIterator[Api]:
    async with deployment_lab(temporal_client, sessions, tmp_path, fleet_text) as lab:
        async with sessions.begin() as session:
            admin = await create_token(session, "admin", label="tests")
        app = create_app(
            Settings(),
            sessions=sessions,
            temporal=temporal_client,
            queues=lab.queues,
            timeouts=FAST_CALLS,
            deployment_timing=FAST,
        )
        await control_worker_seen(app)
        async with http_client(app) as http:
            yield Api(http, lab, bearer(admin), fleet_text)


def ready(n: int):
    return lambda d: d["available"] == n and len(d["replicas"]) == n and d["state"] == "steady"


def in_namespace(manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["namespace"] = namespace
    return manifest


PROD = "/v1/namespaces/prod/deployments/llama"


async def test_the_same_name_in_two_namespaces_is_two_deployments(api: Api) -> None:
    response = await api.http.put("/v1/deployments/llama", json=deployment("llama", 2), headers=api.admin)
    assert response.json() == {"name": "llama", "created": True, "workflow_id": "deployment/llama"}
    await api.wait_for("/v1/deployments/llama", ready(2))
    # No namespace in the body: the path's is taken.
    response = await api.http.put(PROD, json=deployment("llama", 2), headers=api.admin)
    assert response.status_code == 202, response.text
    assert response.json() == {"name": "llama", "created": True, "workflow_id": "deployment/prod/llama"}
    prod = await api.wait_for(PROD, ready(2))
    assert (prod["namespace"], prod["workflow_id"], prod["phase"]) == (
        "prod",
        "deployment/prod/llama",
        "FullyScheduled",
    )
    # Each namespace's replicas hold their own nodes: the fleet's four are taken, two by each.
    assert [(r["cluster"], r["index"]) for r in prod["replicas"]] == [("east", 0), ("west", 0)]
    assert await api.ledger() == [
        ("default", "llama-east-0", "east", 1),
        ("default", "llama-west-0", "west", 1),
        ("prod", "llama-east-0", "east", 1),
        ("prod", "llama-west-0", "west", 1),
    ]
    assert sorted(api.lab.clusters.workload_files()) == sorted(
        [
            api.lab.home / "clusters" / cluster / "workloads" / sub / f"llama-{cluster}-0.json"
            for cluster in ("east", "west")
            for sub in ("", "prod")
        ]
    )
    default = (await api.http.get("/v1/deployments/llama", headers=api.admin)).json()
    assert (default["namespace"], default["workflow_id"]) == ("default", "deployment/llama")
    same = (await api.http.get("/v1/namespaces/default/deployments/llama", headers=api.admin)).json()
    assert same["workflow_id"] == "deployment/llama" and same["available"] == 2
    replica = api.lab.client.get_workflow_handle("replica/prod/llama/east/0")
    assert (await replica.describe()).status is not None

    listed = (await api.http.get("/v1/deployments", headers=api.admin)).json()["deployments"]
    assert [(d["namespace"], d["name"], d["available"]) for d in listed] == [
        ("default", "llama", 2),
        ("prod", "llama", 2),
    ]
    only = (await api.http.get("/v1/deployments", params={"namespace": "prod"}, headers=api.admin)).json()
    assert [(d["namespace"], d["name"]) for d in only["deployments"]] == [("prod", "llama")]

    # A body naming another namespace than the path's is refused, naming the field; nothing changes.
    for path, body in (
        ("/v1/deployments/llama", in_namespace(deployment("llama", 1), "prod")),
        (PROD, in_namespace(deployment("llama", 1), "staging")),
    ):
        response = await api.http.put(path, json=body, headers=api.admin)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and error["details"][0]["field"] == "body.metadata.namespace"
        assert "metadata.namespace" in error["message"]
    # The body may say its namespace when it is the path's.
    response = await api.http.put(PROD, json=in_namespace(deployment("llama", 1), "prod"), headers=api.admin)
    assert response.status_code == 202 and response.json()["created"] is False
    await api.wait_for(PROD, lambda d: d["desired"] == 1 and ready(1)(d))
    assert (await api.http.get("/v1/deployments/llama", headers=api.admin)).json()["desired"] == 2

    # Deleting one namespace's deployment leaves the other's replicas, ledger and workloads alone.
    response = await api.http.delete(PROD, headers=api.admin)
    assert response.status_code == 202 and response.json()["workflow_id"] == "deployment/prod/llama"
    await api.gone(PROD)
    assert await api.ledger() == [("default", "llama-east-0", "east", 1), ("default", "llama-west-0", "west", 1)]
    assert [p.parent.name for p in api.lab.clusters.workload_files()] == ["workloads", "workloads"]
    assert (await api.http.get("/v1/deployments/llama", headers=api.admin)).json()["available"] == 2
    for method in ("GET", "DELETE"):
        response = await api.http.request(method, PROD, headers=api.admin)
        assert response.status_code == 404 and "prod/llama" in response.json()["error"]["message"]
    bad = await api.http.get("/v1/namespaces/Not_A_Namespace/deployments/llama", headers=api.admin)
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "path.namespace"
    await api.http.delete("/v1/deployments/llama", headers=api.admin)
    await api.gone("/v1/deployments/llama")


async def test_a_model_cache_applied_with_the_fleet_keeps_replicas_where_it_is_staged(api: Api) -> None:
    cached = deployment("cached", 2)
    cached["spec"]["template"]["spec"]["modelCacheRef"] = {"name": "llama-weights"}
    path = "/v1/namespaces/prod/deployments/cached"
    # Before the cache is applied, the deployment holds: nothing placed, and it says why.
    response = await api.http.put(path, json=cached, headers=api.admin)
    assert response.status_code == 202, response.text
    body = await api.wait_for(path, lambda d: d["phase"] is not None)
    assert body["replicas"] == [] and body["reason"] == "ModelCacheNotFound"
    assert body["message"].startswith("ModelCache llama-weights not found; holding replica placement")

    applied = await api.put_fleet(CACHE)
    assert {"kind": "ModelCache", "name": "prod/llama-weights", "action": "created"} in applied["changes"]
    response = await api.http.put(path, json=cached, headers=api.admin)  # re-plans now (the resync would, later)
    assert response.status_code == 202, response.text
    # Only west has the weights (east is still hydrating): both replicas there.
    body = await api.wait_for(path, ready(2))
    assert [(r["cluster"], r["index"]) for r in body["replicas"]] == [("west", 0), ("west", 1)]
    assert body["phase"] == "FullyScheduled"
    # The cache is namespaced: the same reference from `default` finds none.
    response = await api.http.put("/v1/deployments/cached", json=cached, headers=api.admin)
    assert response.status_code == 202, response.text
    other = await api.wait_for("/v1/deployments/cached", lambda d: d["phase"] is not None)
    assert other["reason"] == "ModelCacheNotFound" and other["replicas"] == []

    # Kept when the file leaves it out, deleted with --prune.
    kept = await api.put_fleet()
    assert {"kind": "ModelCache", "name": "prod/llama-weights", "action": "kept"} in kept["changes"]
    pruned = await api.put_fleet(prune=True)
    assert {"kind": "ModelCache", "name": "prod/llama-weights", "action": "deleted"} in pruned["changes"]
    async with api.lab.sessions() as session:
        assert (await session.execute(text("SELECT count(*) FROM model_caches"))).scalar_one() == 0
    for gone in (path, "/v1/deployments/cached"):
        await api.http.delete(gone, headers=api.admin)
        await api.gone(gone)


AUTOSCALED = """\
apiVersion: modelplane.ai/v1alpha1
kind: InferenceClass
metadata: {name: h200}
spec:
  capabilities: [vllm]
  devices:
  - {name: gpu, claim: DRA, driver: gpu.nvidia.com, count: 8,
     attributes: {productName: {string: NVIDIA-H200}}, capacity: {memory: {value: 141Gi}}}
---
apiVersion: modelplane.ai/v1alpha1
kind: InferenceCluster
metadata: {name: east, labels: {tier: prod}}
spec:
  nodePools: [{name: serve, className: h200, nodeCount: 1, maxNodeCount: 3}]
"""


@pytest.mark.parametrize("fleet_text", [AUTOSCALED])
async def test_an_autoscaling_pool_counts_max_node_count_as_berth_plan_does(api: Api) -> None:
    response = await api.http.put(
        "/v1/deployments/scaled", json=deployment("scaled", 4, min_replicas=1), headers=api.admin
    )
    assert response.status_code == 202, response.text
    body = await api.wait_for("/v1/deployments/scaled", ready(3))
    assert [(r["cluster"], r["index"]) for r in body["replicas"]] == [("east", 0), ("east", 1), ("east", 2)]
    assert body["phase"] == "PartiallyScheduled" and body["message"].startswith("3 of 4 replicas scheduled")
    assert (
        "capacity counts nodes the autoscaler has not created yet (maxNodeCount) in east/serve "
        "(3 counted, nodeCount 1); replicas there wait for them"
    ) in body["message"]
    # The ledger took all three: it counts what the planner counts.
    assert [row[1:] for row in await api.ledger()] == [
        ("scaled-east-0", "east", 1),
        ("scaled-east-1", "east", 1),
        ("scaled-east-2", "east", 1),
    ]
    assert body["recent_failures"] == []
    await api.http.delete("/v1/deployments/scaled", headers=api.admin)
    await api.gone("/v1/deployments/scaled")
