"""Berth's Temporal workers.

    python worker.py control                 workflows and control activities on `berth.control`
    python worker.py node --node-id NODE     one GPU host's agent on `berth.node.NODE` (activities only), reporting
                                             its host to the API (`--topology host|simulated`)

(also `berth worker control` and `berth worker node --node-id NODE`). Both stop gracefully on SIGTERM or Ctrl-C:
running activities get time to finish before the process leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.worker import Worker

from activities.cluster.activities import ClusterActivities
from activities.cluster.driver import ClusterDriver
from activities.cluster.kubernetes import KubernetesClusterDriver
from activities.cluster.simulated import SimulatedClusterDriver
from activities.cluster.targets import ClusterTargets
from activities.control.audit import AuditActivities
from activities.control.claims import ClaimActivities
from activities.control.deployments import DeploymentActivities
from activities.control.placement import PlacementActivities
from activities.control.records import RecordActivities
from activities.node.agent import NodeAgent
from activities.node.approved import ApprovedSlots
from activities.node.drivers import VmDriver
from activities.node.host.gpu_details import GpuDetails
from activities.node.host.topology import HostTopology
from activities.node.leases import LeaseStore
from activities.node.libvirt.driver import LibvirtSettings
from activities.node.reporter import NodeReporter
from activities.node.simulated import SimulatedTopology, SimulatedVmDriver
from config.settings import get_settings
from fleet.loader import load_fleet
from fleet.node import Simulation
from workflows import code_cache
from workflows.allocation import AllocationWorkflow
from workflows.deployment import DeploymentWorkflow
from workflows.reconcile import ReconcileWorkflow
from workflows.reconcile_client import ensure_schedule
from workflows.recovery import SlotRecoveryWorkflow
from workflows.replica import ReplicaWorkflow
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES
from workflows.task_queues import CONTROL_QUEUE, NODE_QUEUE_PREFIX, Queues


class MissingSearchAttributes(RuntimeError):
    pass


async def check_search_attributes(client: Client) -> None:
    """Refuse to start against a server without Berth's search attributes: the UI would silently lose them."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    missing = [key.name for key in SEARCH_ATTRIBUTES if key.name not in response.custom_attributes]
    if missing:
        raise MissingSearchAttributes(
            f"the Temporal namespace {client.namespace!r} lacks the search attributes {', '.join(missing)}; register "
            "them, e.g. `temporal operator search-attribute create --name BerthState --type Keyword` (BerthGpuCount "
            "is Int, the others Keyword)"
        )


def simulated_clusters(state_dir: Path | None = None) -> SimulatedClusterDriver:
    """The simulated Kubernetes clusters ModelDeployment replicas run on: workload files under `<state>/clusters`."""
    return SimulatedClusterDriver((state_dir or get_settings().state_dir) / "clusters")


def cluster_drivers(sessions: async_sessionmaker[AsyncSession], fallback: ClusterDriver | None = None) -> ClusterDriver:
    """Real clusters (those with a connection in PostgreSQL) through Kubernetes, every other one simulated. Needs the
    worker's running event loop (the driver's lookups run their queries there); without one, all are simulated."""
    fallback = fallback or simulated_clusters()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return fallback
    return KubernetesClusterDriver(ClusterTargets(sessions, loop), fallback, get_settings().cluster_secrets_dir)


def control_activities(
    sessions: async_sessionmaker[AsyncSession], clusters: ClusterDriver | None = None
) -> list[object]:
    clusters = clusters or cluster_drivers(sessions)
    return [
        *PlacementActivities(sessions).activities(),
        *ClaimActivities(sessions).activities(),
        *RecordActivities(sessions).activities(),
        *DeploymentActivities(sessions, clusters).activities(),
        *ClusterActivities(clusters).activities(),
    ]


def control_worker(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    task_queue: str = CONTROL_QUEUE,
    clusters: ClusterDriver | None = None,
    max_local_activities: int = 16,
) -> Worker:
    code_cache.install()  # the sandbox re-imports workflow modules per run: compile them once (workflows/code_cache.py)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[AllocationWorkflow, SlotRecoveryWorkflow, DeploymentWorkflow, ReplicaWorkflow, ReconcileWorkflow],
        activities=[*control_activities(sessions, clusters), *AuditActivities(sessions, client).activities()],
        # The control steps are local activities, each holding its workflow task and a database connection while it
        # runs: more at once than the engine's pool (10 + 10 overflow by default) would only queue inside the pool,
        # where a burst waits out the pool timeout and the workflow task its own; here they wait their turn.
        max_concurrent_local_activities=max_local_activities,
        graceful_shutdown_timeout=timedelta(seconds=10),
    )


def simulated_agent(fleet_file: Path, node_id: str, state_dir: Path, lease_seconds: float = 120.0) -> NodeAgent:
    """A node agent whose host is simulated from the node's entry in the fleet file."""
    fleet = load_fleet([fleet_file])
    node = next((n for pool in fleet.host_pools() for n in pool.nodes if n.name == node_id), None)
    if node is None:
        raise ValueError(f"node {node_id!r} is not in {fleet_file}")
    home = state_dir / "nodes" / node_id
    return NodeAgent(
        node_id,
        SimulatedTopology(node),
        SimulatedVmDriver(home, node.simulation),
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
    if libvirt is None:
        vms: VmDriver = SimulatedVmDriver(home, Simulation())
    else:
        from activities.node.libvirt.driver import LibvirtVmDriver  # needs libvirt-python (the `host` extra)

        cpus = {cell.id: cell.cpus for cell in topology.discover().numa}
        vms = LibvirtVmDriver(libvirt, cpus)
    return NodeAgent(node_id, topology, vms, LeaseStore(home / "leases"))


def node_worker(
    client: Client, agent: NodeAgent, executor: ThreadPoolExecutor, task_queue: str | None = None
) -> Worker:
    return Worker(
        client,
        task_queue=task_queue or f"{NODE_QUEUE_PREFIX}{agent.node}",
        activities=agent.activities(),
        activity_executor=executor,
        max_concurrent_activities=16,
        graceful_shutdown_timeout=timedelta(seconds=10),
    )


async def reap_leases(agent: NodeAgent, every_seconds: float = 10.0) -> None:
    """Delete expired leases: a plan whose allocation never confirmed it must not hold slots for ever."""
    while True:
        await asyncio.to_thread(agent.leases.reap)
        await asyncio.sleep(every_seconds)


async def run_until_signalled(
    workers: Sequence[Worker], background: Sequence[asyncio.Task[None]] = (), ready: Callable[[], None] | None = None
) -> None:
    """Run the workers until SIGINT or SIGTERM; `ready` is called once they have all started (a supervisor's cue)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        if ready is not None:
            ready()
        await stop.wait()
    for task in background:
        task.cancel()


async def run_control(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    task_queue: str = CONTROL_QUEUE,
    ready: Callable[[], None] | None = None,
) -> None:
    await check_search_attributes(client)
    await ensure_schedule(client, Queues(control=task_queue, node_prefix=get_settings().node_task_queue_prefix))
    await run_until_signalled([control_worker(client, sessions, task_queue)], ready=ready)


async def run_node(
    client: Client, agent: NodeAgent, task_queue: str | None = None, reporter: NodeReporter | None = None
) -> None:
    """Serve the node's task queue; with a reporter, report the host first and then every interval."""
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"agent-{agent.node}") as executor:
        background = [asyncio.create_task(reap_leases(agent))]
        if reporter is not None:
            background.append(asyncio.create_task(reporter.run()))
        await run_until_signalled([node_worker(client, agent, executor, task_queue)], background)


async def run_nodes(
    client: Client,
    agents: Sequence[NodeAgent],
    task_queue_prefix: str = NODE_QUEUE_PREFIX,
    reporters: Sequence[NodeReporter] = (),
    ready: Callable[[], None] | None = None,
) -> None:
    """Several node agents in one process (the dev stack's simulated hosts: one Python process per host would cost
    a core's worth of start-up on a laptop), each on its own task queue with its own lease reaper and reporter."""
    with ThreadPoolExecutor(max_workers=max(16, 8 * len(agents)), thread_name_prefix="agents") as executor:
        background = [asyncio.create_task(reap_leases(agent)) for agent in agents]
        background.extend(asyncio.create_task(reporter.run()) for reporter in reporters)
        workers = [node_worker(client, agent, executor, f"{task_queue_prefix}{agent.node}") for agent in agents]
        await run_until_signalled(workers, background, ready)


if __name__ == "__main__":
    from cli.worker import app

    app()
