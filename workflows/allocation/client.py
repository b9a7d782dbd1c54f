"""Thin async functions that start and act on allocation workflows: what the API and the CLI call.

Every call that needs a worker to answer (updates, queries) is bounded by a timeout, because Temporal would
otherwise wait for a worker for ever (sdk-python#514): the caller gets `WorkerUnavailable` instead of a hang.
"""

from __future__ import annotations

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import QueryRejectCondition, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from workflows.allocation.messages import (
    AllocationInput,
    AllocationStatus,
    ExtendRequest,
    ReleaseRequest,
    RetryAccepted,
    RetryRequest,
)
from workflows.allocation.mirror import initial_search_attributes
from workflows.allocation.revisions import REVISION
from workflows.allocation.workflow import AllocationWorkflow
from workflows.client_calls import Rejected, bounded, refusal

DEFAULT_TIMEOUT = 10.0


# The memo key under which a workflow keeps the fingerprint of the request that started it, so a second start under
# the same id (an Idempotency-Key retried) can tell "the same request again" from "another request, same key".
REQUEST_FINGERPRINT = "berth.request_sha256"


def workflow_id(allocation_id: str) -> str:
    return f"allocation/{allocation_id}"


def summary(input: AllocationInput) -> str:
    request = input.request
    product = f"{request.gpu_product} " if request.gpu_product else ""
    shape = "slice" if request.shape.value == "gpu_slice" else "bare metal"
    return f"{request.gpu_count}x {product}{shape}, tenant {input.tenant}"


async def start_allocation(
    client: Client, input: AllocationInput, fingerprint: str | None = None, revision: int = REVISION
) -> WorkflowHandle[AllocationWorkflow, AllocationStatus]:
    """Start the allocation's workflow. A failed allocation may be started again under the same id (a new run);
    a running or completed one may not (`WorkflowAlreadyStartedError`). The run gets the workflow's current
    revision, which it keeps for life (`revision`: another this code runs, for a benchmark or a test that compares)."""
    input = input.model_copy(update={"revision": revision})
    return await client.start_workflow(
        AllocationWorkflow.run,
        input,
        id=workflow_id(input.allocation_id),
        task_queue=input.queues.control,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        search_attributes=initial_search_attributes(input),
        static_summary=summary(input),
        static_details=f"allocation `{input.allocation_id}`: {input.request.describe()}",
        memo={REQUEST_FINGERPRINT: fingerprint} if fingerprint else None,
    )


async def started_fingerprint(client: Client, allocation_id: str) -> str | None:
    """The request fingerprint the allocation's workflow was started with (None for one started without)."""
    description = await handle(client, allocation_id).describe()
    value = await description.memo_value(REQUEST_FINGERPRINT, None)
    return value if isinstance(value, str) else None


def handle(client: Client, allocation_id: str) -> WorkflowHandle[AllocationWorkflow, AllocationStatus]:
    return client.get_workflow_handle_for(AllocationWorkflow.run, workflow_id(allocation_id))


async def status(client: Client, allocation_id: str, wait_seconds: float = DEFAULT_TIMEOUT) -> AllocationStatus:
    """The running workflow's own account. Only an open run answers: a closed one (released, failed, or terminated
    in the Temporal UI, which skips the compensation) would replay its last state, `active` for a terminated hold,
    while the row and the reconciler know better (`WorkflowQueryRejectedError`). A query that reached a run as it
    continued as new (a hold handing over) is asked again: the new run answers it."""

    async def ask() -> AllocationStatus:
        while True:
            try:
                return await handle(client, allocation_id).query(
                    AllocationWorkflow.status_query, reject_condition=QueryRejectCondition.NOT_OPEN
                )
            except WorkflowQueryRejectedError as rejected:
                if rejected.status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
                    raise

    return await bounded(ask(), wait_seconds)


async def retry(
    client: Client, allocation_id: str, exclude_nodes: list[str], wait_seconds: float = DEFAULT_TIMEOUT
) -> RetryAccepted:
    try:
        return await bounded(
            handle(client, allocation_id).execute_update(
                AllocationWorkflow.retry, RetryRequest(exclude_nodes=exclude_nodes)
            ),
            wait_seconds,
        )
    except WorkflowUpdateFailedError as exc:
        raise refusal(exc) from exc


async def release(client: Client, allocation_id: str, wait_seconds: float = DEFAULT_TIMEOUT) -> AllocationStatus:
    try:
        return await bounded(
            handle(client, allocation_id).execute_update(AllocationWorkflow.release, ReleaseRequest()), wait_seconds
        )
    except WorkflowUpdateFailedError as exc:
        raise refusal(exc) from exc


async def extend(
    client: Client, allocation_id: str, request: ExtendRequest, wait_seconds: float = DEFAULT_TIMEOUT
) -> AllocationStatus:
    """Move an active allocation's end later; the workflow's validator refuses what it may not do."""
    try:
        return await bounded(
            handle(client, allocation_id).execute_update(AllocationWorkflow.extend, request), wait_seconds
        )
    except WorkflowUpdateFailedError as exc:
        raise refusal(exc) from exc


async def cancel(client: Client, allocation_id: str) -> None:
    """Request cancellation: the workflow compensates everything it did and ends `cancelled`."""
    target = handle(client, allocation_id)
    description = await target.describe()
    if description.status != WorkflowExecutionStatus.RUNNING:
        raise Rejected(f"allocation {allocation_id} is no longer running ({description.status.name.lower()})")
    await target.cancel()


async def restart_failed(
    client: Client, input: AllocationInput
) -> WorkflowHandle[AllocationWorkflow, AllocationStatus]:
    """Retry a failed allocation: a new run of the same workflow id, with the same request."""
    try:
        return await start_allocation(client, input)
    except WorkflowAlreadyStartedError as exc:
        raise Rejected(
            f"allocation {input.allocation_id} is running or has finished; only a failed one restarts"
        ) from exc
