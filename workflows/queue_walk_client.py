"""Ask for a walk of every queue now (workflows/queue_walk.py): signal-with-start of the one `queue-walk/<control queue>` workflow."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy

from contracts.task_queues import Queues
from workflows.queue_walk import QueueWalkInput, QueueWalkWorkflow, workflow_id


async def walk_queues(client: Client, queues: Queues, reason: str) -> None:
    """Start the walk, or, while one runs, ask it for one more. Returns once Temporal has the request; the walk runs
    on the control worker."""
    await client.start_workflow(
        QueueWalkWorkflow.run,
        QueueWalkInput(queues=queues),
        id=workflow_id(queues),
        task_queue=queues.control,
        start_signal="again",
        start_signal_args=[reason],
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        static_summary="admission pass: capacity may have grown",
    )
