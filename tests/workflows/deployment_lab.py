"""A small Kubernetes fleet for ModelDeployment tests: clusters with `kubernetes` pools counted in nodes, applied
to the test's database, a control worker whose cluster driver is the simulated one (workload files under the test's
directory) or the Kubernetes one against an API server fake per cluster, and what a platform team would check:
ledger rows in SQL and the workloads on the clusters."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.worker import Worker

import worker
from activities.cluster.driver import ClusterDriver
from activities.cluster.kubernetes import KubernetesClusterDriver
from activities.cluster.simulated import SimulatedClusterDriver
from activities.cluster.targets import ClusterTargets
from contracts.cluster import DEFAULT_GATEWAY
from contracts.task_queues import Queues
from fleet.loader import load_fleet
from store.apply import apply_fleet
from tests.kube_fake import FakeKubernetes, node, node_list
from workflows.deployment import client as deployment_client
from workflows.deployment.messages import DeploymentStatus, DeploymentTiming

FAST = DeploymentTiming(
    resync_seconds=3600,
    readiness_timeout_seconds=20,
    readiness_window_seconds=0.5,
    readiness_poll_seconds=0.1,
    conflict_backoff_seconds=0.2,
    removal_wait_seconds=20,
)


def k8s_fleet(clusters: dict[str, int], labels: dict[str, str] | None = None) -> str:
    """Clusters with one `kubernetes` pool `serve` of H200 nodes each: name -> node count."""
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "modelplane.ai/v1alpha1",
            "kind": "InferenceClass",
            "metadata": {"name": "h200"},
            "spec": {
                "capabilities": ["vllm"],
                "devices": [
                    {
                        "name": "gpu",
                        "claim": "DRA",
                        "driver": "gpu.nvidia.com",
                        "count": 8,
                        "attributes": {"productName": {"string": "NVIDIA-H200"}},
                        "capacity": {"memory": {"value": "141Gi"}},
                    }
                ],
            },
        }
    ]
    for name, nodes in clusters.items():
        documents.append(
            {
                "apiVersion": "modelplane.ai/v1alpha1",
                "kind": "InferenceCluster",
                "metadata": {"name": name, "labels": labels or {"tier": "prod"}},
                "spec": {"nodePools": [{"name": "serve", "className": "h200", "nodeCount": nodes}]},
            }
        )
    return yaml.safe_dump_all(documents, sort_keys=False)


def deployment(
    name: str, replicas: int, min_replicas: int | None = None, gpus: int = 8, product: str = "NVIDIA-H200"
) -> dict[str, Any]:
    """A one-engine deployment: each replica is one pod claiming `gpus` GPUs of `product` (one node)."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "template": {
            "spec": {
                "clusterSelector": {"matchLabels": {"tier": "prod"}},
                "engines": [
                    {
                        "name": "serve",
                        "members": [
                            {
                                "role": "Standalone",
                                "nodeSelector": {
                                    "devices": [
                                        {
                                            "name": "gpu",
                                            "count": gpus,
                                            "selectors": [
                                                {
                                                    "cel": f'device.attributes["gpu.nvidia.com"].productName == "{product}"'
                                                }
                                            ],
                                        }
                                    ]
                                },
                            }
                        ],
                    }
                ],
            }
        },
    }
    if min_replicas is not None:
        spec["minReplicas"] = min_replicas
    return {"apiVersion": "modelplane.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name}, "spec": spec}


# The cluster drivers the deployment tests run on: the simulated one, and the Kubernetes one against an API server
# fake per cluster (tests/kube_fake.py), each cluster registered with a kubeconfig Secret as an operator would.
CLUSTER_DRIVERS = ["simulated", "kubernetes"]


@dataclass
class DeploymentLab:
    client: Client
    sessions: async_sessionmaker[AsyncSession]
    home: Path
    queues: Queues
    clusters: SimulatedClusterDriver
    timing: DeploymentTiming = FAST
    kube: dict[str, FakeKubernetes] = field(default_factory=dict)  # cluster -> its API server (driver kubernetes)

    async def apply(self, manifest: dict[str, Any], timing: DeploymentTiming | None = None) -> bool:
        name = manifest["metadata"]["name"]
        return await deployment_client.apply(  # a generous wait: the whole suite shares two cores
            self.client, name, manifest, queues=self.queues, timing=timing or self.timing, wait_seconds=60
        )

    def handle(self, name: str) -> WorkflowHandle[Any, DeploymentStatus]:
        return deployment_client.handle(self.client, name)

    async def status(self, name: str) -> DeploymentStatus:
        return await deployment_client.status(self.client, name)

    async def wait_until(self, name: str, check: Any, timeout: float = 30) -> DeploymentStatus:
        """Poll the status query until `check(status)` holds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            status = await self.status(name)
            if check(status):
                return status
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"deployment {name} never got there: {status.model_dump()}")
            await asyncio.sleep(0.1)

    async def settled(self, name: str, available: int, timeout: float = 30) -> DeploymentStatus:
        """Every replica ready and exactly `available` of them."""
        return await self.wait_until(
            name,
            lambda s: (
                s.state == "steady"
                and s.available == available
                and len(s.replicas) == available
                and all(r.phase == "ready" for r in s.replicas)
            ),
            timeout,
        )

    async def closed(self, name: str, timeout: float = 30) -> WorkflowExecutionStatus:
        """Wait for the deployment's workflow to end; its final status."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (description := await self.handle(name).describe()).status == WorkflowExecutionStatus.RUNNING:
            assert asyncio.get_running_loop().time() < deadline, f"deployment {name} is still running"
            await asyncio.sleep(0.1)
        assert description.status is not None
        return description.status

    # What a platform team would check ---------------------------------------------------------------------------

    async def ledger(self) -> list[tuple[str, str, str, int]]:
        """(replica, cluster, pool, nodes) for every ledger row."""
        async with self.sessions() as session:
            rows = await session.execute(
                text(
                    "SELECT u.replica, p.cluster, p.name, u.nodes FROM replica_pool_usage u "
                    "JOIN pools p ON p.id = u.pool_id ORDER BY u.replica"
                )
            )
            return [tuple(r) for r in rows]

    async def overcommitted_pools(self) -> list[tuple[str, str, int, int]]:
        async with self.sessions() as session:
            rows = await session.execute(
                text(
                    "SELECT p.cluster, p.name, p.node_count, sum(u.nodes) FROM replica_pool_usage u "
                    "JOIN pools p ON p.id = u.pool_id GROUP BY p.id HAVING sum(u.nodes) > p.node_count"
                )
            )
            return [tuple(r) for r in rows]

    async def replica_rows(self) -> list[tuple[str, str, int, str]]:
        async with self.sessions() as session:
            rows = await session.execute(
                text("SELECT name, cluster, replica_index, state FROM model_replicas ORDER BY name")
            )
            return [tuple(r) for r in rows]

    async def deployment_row(self, name: str) -> dict[str, Any] | None:
        async with self.sessions() as session:
            row = (
                await session.execute(text("SELECT status FROM model_deployments WHERE name = :n"), {"n": name})
            ).first()
            return row[0] if row else None

    def workloads(self) -> list[str]:
        """`cluster/replica` for every workload on the clusters (files when simulated, labelled objects when real)."""
        if self.kube:
            return sorted(f"{c}/{w.split('/', 1)[1]}" for c, api in self.kube.items() for w in api.workloads())
        return [f"{p.parent.parent.name}/{p.stem}" for p in self.clusters.workload_files()]

    def first_pod(self, cluster: str, replica: str) -> tuple[dict[str, str], int]:
        """The node selector of the replica's first pod and the devices its claim asks for."""
        if cluster in self.kube:
            api = self.kube[cluster]
            pod = next(
                d for d in api.of_kind("Deployment") if d["metadata"]["labels"]["modelplane.ai/replica"] == replica
            )["spec"]["template"]
            claim_name = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            claim = next(c for c in api.of_kind("ResourceClaimTemplate") if c["metadata"]["name"] == claim_name)
            return pod["spec"]["nodeSelector"], claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"]
        stored = self.clusters.stored(cluster, replica)
        assert stored is not None and stored.workload.pods[0].resource_claim is not None
        pod = stored.workload.pods[0]
        return pod.node_selector, pod.resource_claim.requests[0].count

    def never_ready(self, cluster: str, never: bool = True) -> None:
        """The cluster's pods stop (or resume) becoming ready."""
        if cluster in self.kube:
            self.kube[cluster].never_ready = never
        else:
            self.clusters.set_simulation(cluster, **({"neverReady": True} if never else {}))


@contextlib.asynccontextmanager
async def deployment_lab(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    home: Path,
    fleet_text: str,
    boot_seconds: float = 0.2,
    driver: str = "simulated",
) -> AsyncIterator[DeploymentLab]:
    home.mkdir(parents=True, exist_ok=True)
    kube: dict[str, FakeKubernetes] = {}
    if driver == "kubernetes":
        fleet_text, kube = _real_clusters(fleet_text, home / "secrets", boot_seconds)
    fleet_file = home / "fleet.yaml"
    fleet_file.write_text(fleet_text)
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([fleet_file]))
    tag = uuid.uuid4().hex[:8]
    queues = Queues(control=f"test-{tag}.control", node_prefix=f"test-{tag}.node.")
    clusters = SimulatedClusterDriver(home / "clusters", boot_seconds=boot_seconds)
    driven: ClusterDriver = clusters
    if kube:
        targets = ClusterTargets(sessions, asyncio.get_running_loop(), ttl_seconds=0.5)
        driven = KubernetesClusterDriver(targets, clusters, home / "secrets", delete_wait_seconds=10, poll_seconds=0.05)
    control: Worker = worker.control_worker(client, sessions, task_queue=queues.control, clusters=driven)
    task = asyncio.create_task(control.run())
    try:
        yield DeploymentLab(client, sessions, home, queues, clusters, kube=kube)
    finally:
        await control.shutdown()
        await task
        for api in kube.values():
            api.stop()


def _real_clusters(fleet_text: str, secrets: Path, boot_seconds: float) -> tuple[str, dict[str, FakeKubernetes]]:
    """Every InferenceCluster of the fleet becomes a real one: an API server fake with a Ready node per pool node
    and a Gateway, its kubeconfig mounted as the Secret `<cluster>-kubeconfig`, and `spec.cluster` naming that
    Secret, as Modelplane's Existing source does."""
    documents = list(yaml.safe_load_all(fleet_text))
    kube: dict[str, FakeKubernetes] = {}
    for document in documents:
        if document.get("kind") == "InferenceCluster":
            name = document["metadata"]["name"]
            kube[name] = FakeKubernetes(boot_seconds=boot_seconds, terminate_seconds=0.1).serve()
            namespace, _, gateway = DEFAULT_GATEWAY.partition("/")
            kube[name].put(
                {
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "kind": "Gateway",
                    "metadata": {"name": gateway, "namespace": namespace},
                    "status": {"addresses": [{"type": "Hostname", "value": f"{name}.gateway.example"}]},
                }
            )
            kube[name].set_nodes(
                node_list(
                    *(
                        node(f"{name}-{pool['name']}-{i}", pool["name"])
                        for pool in document["spec"]["nodePools"]
                        for i in range(pool.get("nodeCount", 1))
                    )
                )
            )
            (secrets / f"{name}-kubeconfig").mkdir(parents=True, exist_ok=True)
            (secrets / f"{name}-kubeconfig" / "kubeconfig").write_text(kube[name].kubeconfig())
            document["spec"]["cluster"] = {
                "source": "Existing",
                "existing": {"secretRef": {"name": f"{name}-kubeconfig"}},
            }
    return yaml.safe_dump_all(documents, sort_keys=False), kube
