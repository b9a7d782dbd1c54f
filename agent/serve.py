"""A node agent process: the agent for its host, its worker on `berth.node.<node>`, the lease reaper and the reporter.

    simulated_agent (a fleet file's entry)  ─┐
    host_agent (sysfs; libvirt or simulated) ─┴─► run_node / run_nodes ─► node_worker per host (activities only)
                                                                        ├► reap_leases per host
                                                                        └► NodeReporter.run per host (when given)

This is what `berth worker node` runs on every GPU host (and `berth worker agents` for the dev stack's simulated
hosts), and every module it imports is resident memory on every host, so it must stay lean: it imports the node
side (agent.*), temporalio, pydantic and the reporter's HTTP client; the fleet file's loader only for a
simulated host, and libvirt only when the libvirt runtime is asked for. Never the control plane (worker.py, the
workflows, store/SQLAlchemy, the API/FastAPI, the cluster drivers): through worker.py an agent took 121 MB
against a target of 80 MB (`python -m bench.memory` measures it). `tests/cli/test_worker_imports.py` fails when
something of the control plane creeps back in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio.client import Client
from temporalio.worker import Worker

from agent.activities import NodeAgent
from agent.approved import ApprovedSlots
from agent.credential import NodeCredential
from agent.drivers import VmDriver
from agent.host.gpu_details import GpuDetails
from agent.host.topology import HostTopology
from agent.leases import LeaseStore
from agent.liveness import HeartbeatWhileRunning
from agent.reporter import HttpReportSink, NodeReporter
from agent.simulated import SimulatedTopology, SimulatedVmDriver
from config.worker_process import run_until_signalled
from contracts.task_queues import NODE_QUEUE_PREFIX
from fleet.node import Simulation

if TYPE_CHECKING:  # the libvirt runtime's modules are imported only when it is asked for (host_agent)
    from agent.libvirt.driver import LibvirtSettings


def simulated_agent(
    fleet_file: Path,
    node_id: str,
    state_dir: Path,
    lease_seconds: float = 120.0,
    libvirt: LibvirtSettings | None = None,
) -> NodeAgent:
    """A node agent whose host is simulated from the node's entry in the fleet file (whose loader only simulated
    agents import: a real host's agent reads no fleet file). With `libvirt`, its VMs are real ones on this
    machine's libvirt while its hardware stays the fleet entry's (`berth up --real-vms`)."""
    from fleet.loader import load_fleet

    fleet = load_fleet([fleet_file])
    node = next((n for pool in fleet.host_pools() for n in pool.nodes if n.name == node_id), None)
    if node is None:
        raise ValueError(f"node {node_id!r} is not in {fleet_file}")
    home = state_dir / "nodes" / node_id
    vms = (
        SimulatedVmDriver(home, node.simulation)
        if libvirt is None
        else libvirt_vms(libvirt, HostTopology(Path("/")), node_id)
    )
    return NodeAgent(
        node_id,
        SimulatedTopology(node, home / "health.json"),
        vms,
        LeaseStore(home / "leases"),
        lease_seconds=lease_seconds,
        approved=ApprovedSlots(node.slots),  # until the control plane's reply says otherwise
    )


def host_agent(
    node_id: str,
    state_dir: Path,
    root: Path = Path("/"),
    gpu_details: GpuDetails | None = None,
    libvirt: LibvirtSettings | None = None,
) -> NodeAgent:
    """A node agent on a real host: topology discovered from sysfs under `root`, approved slots from the control
    plane's reply to its first report, and VMs on libvirt when `libvirt` is given (else the simulated runtime)."""
    home = state_dir / "nodes" / node_id
    topology = HostTopology(root, gpu_details)
    vms = SimulatedVmDriver(home, Simulation()) if libvirt is None else libvirt_vms(libvirt, topology, node_id)
    return NodeAgent(node_id, topology, vms, LeaseStore(home / "leases"))


def libvirt_vms(settings: LibvirtSettings, topology: HostTopology, node_id: str) -> VmDriver:
    """The libvirt runtime, its VMs pinned to this machine's NUMA cells as sysfs describes them."""
    from agent.libvirt.driver import LibvirtVmDriver  # needs libvirt-python (the `host` extra)

    cpus = {cell.id: cell.cpus for cell in topology.discover().numa}
    return LibvirtVmDriver(settings, cpus, node=node_id)


def node_worker(
    client: Client, agent: NodeAgent, executor: ThreadPoolExecutor, task_queue: str | None = None
) -> Worker:
    """The agent's activities on its own task queue (no workflows: those run on the control worker)."""
    return Worker(
        client,
        task_queue=task_queue or f"{NODE_QUEUE_PREFIX}{agent.node}",
        activities=agent.activities(),
        activity_executor=executor,
        max_concurrent_activities=16,
        graceful_shutdown_timeout=timedelta(seconds=10),
        interceptors=[HeartbeatWhileRunning()],  # the agent's liveness while a step runs (liveness.py)
        max_heartbeat_throttle_interval=timedelta(seconds=2),  # each beat sent when due, not 0.8 x the timeout later
    )


async def reap_leases(agent: NodeAgent, every_seconds: float = 10.0) -> None:
    """Delete expired leases: a plan whose allocation never confirmed it must not hold slots for ever."""
    while True:
        await asyncio.to_thread(agent.leases.reap)
        await asyncio.sleep(every_seconds)


async def run_node(
    client: Client,
    agent: NodeAgent,
    task_queue: str | None = None,
    reporter: NodeReporter | None = None,
    credential: NodeCredential | None = None,
    alive: Path | None = None,
) -> None:
    """Serve the node's task queue; with a reporter, report the host first and then every interval; with a
    credential from a file, take a rotated token within seconds (the client's and the reporter's); with `alive`,
    touch that file while the loop turns (a DaemonSet's probe)."""
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"agent-{agent.node}") as executor:
        background = [asyncio.create_task(reap_leases(agent))]
        if reporter is not None:
            background.append(asyncio.create_task(reporter.run()))
        if credential is not None:
            background.append(asyncio.create_task(credential.watch(*token_uses(client, reporter))))
        await run_until_signalled([node_worker(client, agent, executor, task_queue)], background, alive=alive)


@dataclass
class HostedNode:
    """One simulated host of `run_nodes`: its agent, its own client to the node gateway (its own token), its reporter
    and credential."""

    agent: NodeAgent
    client: Client
    reporter: NodeReporter | None = None
    credential: NodeCredential | None = None


async def run_nodes(
    nodes: Sequence[HostedNode],
    task_queue_prefix: str = NODE_QUEUE_PREFIX,
    ready: Callable[[], None] | None = None,
) -> None:
    """Several node agents in one process (the dev stack's simulated hosts: one Python process per host would cost
    a core's worth of start-up on a laptop), each on its own task queue, through its own connection with its own
    token, with its own lease reaper and reporter. The reporters are started by `ready` (devstack/agents.py)."""
    with ThreadPoolExecutor(max_workers=max(16, 8 * len(nodes)), thread_name_prefix="agents") as executor:
        background = [asyncio.create_task(reap_leases(node.agent)) for node in nodes]
        background.extend(
            asyncio.create_task(node.credential.watch(*token_uses(node.client, node.reporter)))
            for node in nodes
            if node.credential is not None
        )
        workers = [
            node_worker(node.client, node.agent, executor, f"{task_queue_prefix}{node.agent.node}") for node in nodes
        ]
        await run_until_signalled(workers, background, ready)


def token_uses(client: Client, reporter: NodeReporter | None) -> list[Callable[[str], None]]:
    """Where a rotated token goes: the client's bearer credential (every later call to the gateway carries it) and
    the reporter's HTTP sink."""

    def to_client(token: str) -> None:
        client.api_key = token

    uses = [to_client]
    sink = getattr(reporter, "sink", None)
    if isinstance(sink, HttpReportSink):
        uses.append(lambda token: setattr(sink, "token", token))
    return uses
