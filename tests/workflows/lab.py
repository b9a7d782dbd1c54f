"""A small GPU lab for workflow tests: a fleet file, the database it is applied to, a control worker and one real
node-agent worker per host (simulated drivers), all on task queues unique to the test.

Tests start and stop agents to play dead hosts, and read back what a platform team would check: slot states,
active claims, lease files and VM records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

import worker
from agent.liveness import HeartbeatWhileRunning
from agent.reporter import NodeReporter
from agent.serve import simulated_agent
from config.settings import Settings
from contracts.allocation import Lease
from contracts.placement import CapacityShape, PlacementRequest
from contracts.task_queues import Queues
from fleet.loader import load_fleet
from gateway.serve import RunningGateway, start_gateway, upstream_channel
from gateway.server import GatewayPolicy
from scheduler.host.report import NodeReport, ReportReply
from store.apply import apply_fleet
from store.models import AllocationEventRow, ClaimRow, SlotRow
from store.node_reports import record_report
from store.tokens import create_token
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import AllocationInput, AllocationStatus, QueueWait, Timing

FAST = Timing(
    agent_pickup_seconds=2.0,
    readiness_timeout_seconds=20.0,
    readiness_poll_seconds=0.2,
    readiness_window_seconds=0.5,
    teardown_attempts=1,
)


def lab_fleet(
    hosts: dict[str, dict[str, Any]],
    metal: int = 0,
    quota: int = 512,
    *,
    tenants: dict[str, dict[str, Any]] | None = None,
    region: dict[str, Any] | None = None,
    extra: list[dict[str, Any]] | None = None,
    slices: dict[str, Any] | None = None,
) -> str:
    """A one-region fleet. `hosts` maps node name to {"gpus": n, "simulation": {...}} for the slice pool; `tenants`
    (name -> spec) replaces the one tenant `acme` with `quota`; `region` is added to the region's spec; `extra`
    documents (PriorityClasses, say) are appended; `slices` is added to the slice pool's spec (`maxLease`, say)."""
    nodes = []
    for n, (name, spec) in enumerate(sorted(hosts.items())):
        gpus = spec.get("gpus", 4)
        nodes.append(
            {
                "name": name,
                "numaNodes": 1,
                "simulation": spec.get("simulation", {}),
                "slots": [
                    {
                        "index": i,
                        "gpuPci": f"0000:{0x10 + i:02x}:00.0",
                        "fabricParentPci": f"0000:{0x40 + i:02x}:00.0",
                        "fabricVfPci": f"0000:{0x40 + i:02x}:00.2",
                        "fabricClaimMode": "per_slot_vf",
                        "mac": f"52:54:00:{n:02x}:00:{i:02x}",
                        "privateIp": f"10.0.{n}.{10 + i}",
                    }
                    for i in range(gpus)
                ],
            }
        )
    pools: list[dict[str, Any]] = [
        {
            "name": "slices",
            "className": "h200",
            "shape": "gpu_slice",
            "gpuProduct": "H200",
            "nodes": nodes,
            **(slices or {}),
        }
    ]
    if metal:
        pools.append(
            {
                "name": "metal",
                "className": "h200",
                "shape": "baremetal",
                "gpuProduct": "H200",
                "nodeTemplate": {"count": metal, "namePrefix": "metal-", "gpusPerNode": 4, "numaNodes": 1},
            }
        )
    documents = [
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "Region",
            "metadata": {"name": "lab"},
            "spec": {"prices": {"H200": 3.0}, **(region or {})},
        },
        *(
            {"apiVersion": "berth.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec}
            for name, spec in (tenants or {"acme": {"gpuQuota": quota}}).items()
        ),
        {
            "apiVersion": "modelplane.ai/v1alpha1",
            "kind": "InferenceClass",
            "metadata": {"name": "h200"},
            "spec": {
                "devices": [
                    {
                        "name": "gpu",
                        "driver": "gpu.nvidia.com",
                        "count": 4,
                        "attributes": {"productName": {"string": "NVIDIA H200"}},
                    }
                ]
            },
        },
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "InferenceCluster",
            "metadata": {"name": "lab-1"},
            "spec": {"region": "lab", "nodePools": pools},
        },
        *(extra or []),
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)


class StoreSink:
    """Takes an agent's report in as the API would (`store.node_reports.record_report`), for labs that run no API
    server; the API route itself is tested in tests/api."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def send(self, node: str, report: NodeReport) -> ReportReply:
        async with self.sessions.begin() as session:
            return await record_report(session, node, report)


@dataclass
class Lab:
    starter: Client  # starts workflows (time-skipping or real time)
    worker_client: Client
    sessions: async_sessionmaker[AsyncSession]
    home: Path
    fleet_file: Path
    queues: Queues
    executor: ThreadPoolExecutor
    gateway: str = ""  # the node gateway's address: every agent reaches Temporal through it, with its own token
    gateway_server: RunningGateway | None = None
    gateway_start: Callable[[str], Awaitable[RunningGateway]] | None = None
    agents: dict[str, tuple[Worker, asyncio.Task[None]]] = field(default_factory=dict)
    control: tuple[Worker, asyncio.Task[None]] | None = None
    node_tokens: dict[str, str] = field(default_factory=dict)

    def agent(self, node: str) -> Any:
        return simulated_agent(self.fleet_file, node, self.home, lease_seconds=60)

    async def start_agent(self, node: str, activities: list[object] | None = None, report: bool = True) -> None:
        """Start the node's agent worker and, like a real agent on start, have it report its host (so the node is
        live and its slots validated); `report=False` plays an agent whose reports never arrive."""
        agent = self.agent(node)
        node_worker = Worker(
            await self.node_client(node),
            task_queue=self.queues.node(node),
            activities=activities or agent.activities(),
            activity_executor=self.executor,
            interceptors=[HeartbeatWhileRunning()],  # as node_worker: the agent's liveness while a step runs
        )
        self.agents[node] = (node_worker, asyncio.create_task(node_worker.run()))
        if report:
            await NodeReporter(agent, StoreSink(self.sessions)).report_once()

    async def node_token(self, node: str) -> str:
        """The node's own token (one per node, made on first use), as `berth tokens create --node` makes it."""
        if node not in self.node_tokens:
            async with self.sessions.begin() as session:
                self.node_tokens[node] = await create_token(session, "node", node=node, label="lab")
        return self.node_tokens[node]

    async def node_client(self, node: str, token: str | None = None) -> Client:
        """A client as the node's agent has one: to the node gateway, with the node's token, never to Temporal."""
        return await Client.connect(
            self.gateway,
            namespace=self.worker_client.namespace,
            api_key=token or await self.node_token(node),
            tls=False,
            data_converter=pydantic_data_converter,
            interceptors=self.worker_client.config()["interceptors"],  # traced as the control plane is, if it is
        )

    async def restart_gateway(self, down_seconds: float) -> None:
        """Stop the node gateway, as a kill would (no grace), and start a new one on the same address and key."""
        assert self.gateway_server is not None and self.gateway_start is not None
        await self.gateway_server.stop(None)
        await asyncio.sleep(down_seconds)
        self.gateway_server = await self.gateway_start(self.gateway)

    async def stop_agent(self, node: str) -> None:
        node_worker, task = self.agents.pop(node)
        await node_worker.shutdown()
        await task

    def start_control(self) -> None:
        control = worker.control_worker(
            self.worker_client,
            self.sessions,
            task_queue=self.queues.control,
            clusters=worker.simulated_clusters(self.home),
        )
        self.control = (control, asyncio.create_task(control.run()))

    async def allocate(
        self,
        allocation_id: str | None = None,
        gpus: int = 2,
        timing: Timing = FAST,
        shape: CapacityShape = CapacityShape.GPU_SLICE,
        tenant: str = "acme",
        queue: QueueWait | None = None,
        lease: Lease | None = None,
        request_body: dict[str, Any] | None = None,
        **request: Any,
    ) -> WorkflowHandle[Any, AllocationStatus]:
        allocation_id = allocation_id or f"a-{uuid.uuid4().hex[:8]}"
        return await allocation_client.start_allocation(
            self.starter,
            AllocationInput(
                allocation_id=allocation_id,
                tenant=tenant,
                request=PlacementRequest(gpu_count=gpus, shape=shape, tenant=tenant, **request),
                timing=timing,
                queues=self.queues,
                queue=queue,
                lease=lease,
                request_body=request_body or {},
            ),
        )

    def input_for(self, allocation_id: str, gpus: int = 2, timing: Timing = FAST) -> AllocationInput:
        return AllocationInput(
            allocation_id=allocation_id,
            tenant="acme",
            request=PlacementRequest(gpu_count=gpus, tenant="acme"),
            timing=timing,
            queues=self.queues,
        )

    async def wait_for_state(
        self, handle: WorkflowHandle[Any, Any], *states: str, timeout: float = 30
    ) -> AllocationStatus:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            status = await handle.query("status_query", result_type=AllocationStatus)
            if status.state in states:
                return status
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"allocation stayed {status.state} (wanted {states}): {status}")
            await asyncio.sleep(0.1)

    # What a platform team would check ---------------------------------------------------------------------------

    async def slot_states(self) -> dict[str, str]:
        async with self.sessions() as session:
            rows = await session.execute(select(SlotRow.node_id, SlotRow.slot_index, SlotRow.state))
            return {f"{node}/{index}": state for node, index, state in rows}

    async def active_claims(self) -> dict[str, list[str]]:
        """allocation -> slots it actively claims."""
        async with self.sessions() as session:
            rows = await session.execute(
                select(ClaimRow.allocation_id, SlotRow.node_id, SlotRow.slot_index)
                .join(SlotRow, SlotRow.id == ClaimRow.slot_id)
                .where(ClaimRow.released_at.is_(None))
            )
            claims: dict[str, list[str]] = {}
            for allocation, node, index in rows:
                claims.setdefault(allocation, []).append(f"{node}/{index}")
            return claims

    async def double_claims(self) -> int:
        async with self.sessions() as session:
            return await session.scalar(
                text(
                    "SELECT count(*) FROM (SELECT slot_id FROM allocation_resource_claims WHERE released_at IS NULL "
                    "GROUP BY slot_id HAVING count(*) > 1) AS doubled"
                )
            )

    async def events(self, allocation_id: str) -> list[tuple[str, str, str | None, str | None]]:
        async with self.sessions() as session:
            rows = await session.execute(
                select(
                    AllocationEventRow.step,
                    AllocationEventRow.state,
                    AllocationEventRow.node_id,
                    AllocationEventRow.reason,
                )
                .where(AllocationEventRow.allocation_id == allocation_id)
                .order_by(AllocationEventRow.id)
            )
            return [tuple(r) for r in rows]

    async def actors(self, allocation_id: str) -> dict[str, str]:
        """step -> who decided it, for the steps the trail names a decider for (a person, a part of Berth)."""
        async with self.sessions() as session:
            rows = await session.execute(
                select(AllocationEventRow.step, AllocationEventRow.actor).where(
                    AllocationEventRow.allocation_id == allocation_id, AllocationEventRow.actor.is_not(None)
                )
            )
            return {str(step): str(actor) for step, actor in rows}

    async def available_slots(self) -> int:
        async with self.sessions() as session:
            return await session.scalar(select(func.count()).select_from(SlotRow).where(SlotRow.state == "available"))

    def lease_files(self) -> list[Path]:
        return sorted(self.home.glob("nodes/*/leases/*.json"))

    def vm_records(self) -> list[Path]:
        return sorted(self.home.glob("nodes/*/vms/*.json"))


@contextlib.asynccontextmanager
async def running_lab(
    starter: Client,
    worker_client: Client,
    sessions: async_sessionmaker[AsyncSession],
    home: Path,
    fleet_text: str,
    agents: list[str] | None = None,
    control: bool = True,
) -> AsyncIterator[Lab]:
    home.mkdir(parents=True, exist_ok=True)
    fleet_file = home / "fleet.yaml"
    fleet_file.write_text(fleet_text)
    fleet = load_fleet([fleet_file])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    tag = uuid.uuid4().hex[:8]
    queues = Queues(control=f"test-{tag}.control", node_prefix=f"test-{tag}.node.")
    upstream = upstream_channel(worker_client.service_client.config.target_host, Settings())
    policy = GatewayPolicy(namespace=worker_client.namespace, queue_prefix=queues.node_prefix)
    key = os.urandom(32)

    def gateway_start(listen: str) -> Awaitable[RunningGateway]:
        return start_gateway(listen, upstream, sessions, key, policy)

    gateway = await gateway_start("127.0.0.1:0")
    with ThreadPoolExecutor(max_workers=32) as executor:
        lab = Lab(
            starter,
            worker_client,
            sessions,
            home,
            fleet_file,
            queues,
            executor,
            gateway=f"127.0.0.1:{gateway.port}",
            gateway_server=gateway,
            gateway_start=gateway_start,
        )
        if control:
            lab.start_control()
        every_node = [n.name for pool in fleet.host_pools() for n in pool.nodes]
        for node in every_node if agents is None else agents:
            await lab.start_agent(node)
        try:
            yield lab
        finally:
            for node in list(lab.agents):
                await lab.stop_agent(node)
            if lab.control is not None:
                await lab.control[0].shutdown()
                await lab.control[1]
            if lab.gateway_server is not None:
                await lab.gateway_server.stop(grace=None)
            await upstream.close()
