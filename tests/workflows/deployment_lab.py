"""A small Kubernetes fleet for ModelDeployment tests: clusters with `kubernetes` pools counted in nodes, applied
to the test's database, a control worker whose cluster driver is the simulated one (workload files under the test's
directory), and what a platform team would check: ledger rows in SQL and workload files on disk."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.worker import Worker

import worker
from activities.cluster.simulated import SimulatedClusterDriver
from fleet.loader import load_fleet
from store.apply import apply_fleet
from workflows import deployment_client
from workflows.deployment_messages import DeploymentStatus, DeploymentTiming
from workflows.task_queues import Queues

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


def deployment(name: str, replicas: int, min_replicas: int | None = None, gpus: int = 8,
               product: str = "NVIDIA-H200") -> dict[str, Any]:  # fmt: skip
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


@dataclass
class DeploymentLab:
    client: Client
    sessions: async_sessionmaker[AsyncSession]
    home: Path
    queues: Queues
    clusters: SimulatedClusterDriver
    timing: DeploymentTiming = FAST

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
        """`cluster/replica` for every workload file on the simulated clusters."""
        return [f"{p.parent.parent.name}/{p.stem}" for p in self.clusters.workload_files()]


@contextlib.asynccontextmanager
async def deployment_lab(
    client: Client, sessions: async_sessionmaker[AsyncSession], home: Path, fleet_text: str,
    boot_seconds: float = 0.2,
) -> AsyncIterator[DeploymentLab]:  # fmt: skip
    home.mkdir(parents=True, exist_ok=True)
    fleet_file = home / "fleet.yaml"
    fleet_file.write_text(fleet_text)
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([fleet_file]))
    tag = uuid.uuid4().hex[:8]
    queues = Queues(control=f"test-{tag}.control", node_prefix=f"test-{tag}.node.")
    clusters = SimulatedClusterDriver(home / "clusters", boot_seconds=boot_seconds)
    control: Worker = worker.control_worker(client, sessions, task_queue=queues.control, clusters=clusters)
    task = asyncio.create_task(control.run())
    try:
        yield DeploymentLab(client, sessions, home, queues, clusters)
    finally:
        await control.shutdown()
        await task
