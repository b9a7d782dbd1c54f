"""Thin async functions that create, update, read and delete ModelDeployment workflows: what the API calls.

Updates and queries need a worker to answer and Temporal would wait for one for ever (sdk-python#514), so each is
bounded: the caller gets `WorkerUnavailable` instead of a hang. A PUT is "create or update", one update-with-start:
the workflow is started if none runs under the id, and the spec arrives as a validated update (a rejected spec raises
`Rejected`).

Deployments are namespaced: `deployment/<name>` in the `default` namespace (the id every deployment had before
namespaces, so running ones stay reachable) and `deployment/<namespace>/<name>` in any other.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from contracts.manifest import DEFAULT_NAMESPACE
from contracts.task_queues import Queues
from workflows.client_calls import Rejected, WorkerUnavailable, bounded, refusal
from workflows.deployment.messages import (
    DeleteRequest,
    DeploymentInput,
    DeploymentStatus,
    DeploymentTiming,
    InventoryChanged,
    SpecUpdate,
    qualified_name,
)
from workflows.deployment.workflow import DeploymentWorkflow, initial_search_attributes

DEFAULT_TIMEOUT = 10.0

__all__ = ["Rejected", "WorkerUnavailable", "apply", "delete", "status", "workflow_id"]


def workflow_id(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Names never hold a slash, so the two forms cannot collide."""
    return f"deployment/{name}" if namespace == DEFAULT_NAMESPACE else f"deployment/{namespace}/{name}"


def handle(
    client: Client, name: str, namespace: str = DEFAULT_NAMESPACE
) -> WorkflowHandle[DeploymentWorkflow, DeploymentStatus]:
    return client.get_workflow_handle_for(DeploymentWorkflow.run, workflow_id(name, namespace))


async def running(client: Client, name: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
    try:
        description = await handle(client, name, namespace).describe()
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return description.status == WorkflowExecutionStatus.RUNNING


async def apply(
    client: Client,
    name: str,
    manifest: dict[str, Any],
    *,
    queues: Queues,
    timing: DeploymentTiming,
    wait_seconds: float = DEFAULT_TIMEOUT,
    namespace: str = DEFAULT_NAMESPACE,
) -> bool:
    """Create the deployment's workflow or give it a new spec, in one call; True if no workflow ran before.

    Temporal's update-with-start starts the workflow when none runs under the id and delivers the spec as a
    validated update either way, atomically: two PUTs racing, or one retried after its answer was lost, never start
    two workflows and never drop a spec (a start that found the workflow running used to ignore its manifest)."""
    created = not await running(client, name, namespace)
    start = WithStartWorkflowOperation(
        DeploymentWorkflow.run,
        DeploymentInput(name=name, namespace=namespace, manifest=manifest, timing=timing, queues=queues),
        id=workflow_id(name, namespace),
        task_queue=queues.control,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=initial_search_attributes(),
        static_summary=f"ModelDeployment {qualified_name(name, namespace)}",
        static_details=f"ModelDeployment `{qualified_name(name, namespace)}`: replicas placed by the fleet scheduler",
    )
    try:
        await bounded(
            client.execute_update_with_start_workflow(
                DeploymentWorkflow.apply_spec, SpecUpdate(manifest=manifest), start_workflow_operation=start
            ),
            wait_seconds,
        )
    except WorkflowUpdateFailedError as error:
        raise refusal(error) from error
    return created


async def status(
    client: Client, name: str, wait_seconds: float = DEFAULT_TIMEOUT, namespace: str = DEFAULT_NAMESPACE
) -> DeploymentStatus:
    return await bounded(handle(client, name, namespace).query(DeploymentWorkflow.status_query), wait_seconds)


async def delete(
    client: Client, name: str, wait_seconds: float = DEFAULT_TIMEOUT, namespace: str = DEFAULT_NAMESPACE
) -> DeploymentStatus:
    """Ask the deployment to tear down every replica and complete."""
    try:
        return await bounded(
            handle(client, name, namespace).execute_update(DeploymentWorkflow.delete, DeleteRequest()), wait_seconds
        )
    except WorkflowUpdateFailedError as error:
        raise refusal(error) from error


async def notify_inventory_changed(client: Client, queues: Queues, reason: str) -> int:
    """Signal every running deployment on this control queue that clusters or pools changed; how many were told."""
    query = f'BerthKind = "deployment" AND ExecutionStatus = "Running" AND TaskQueue = "{queues.control}"'
    told = 0
    async for execution in client.list_workflows(query):
        await client.get_workflow_handle(execution.id).signal(
            DeploymentWorkflow.inventory_changed, InventoryChanged(reason=reason)
        )
        told += 1
    return told
