"""Ask for an admission pass over every queue now (workflows/queue_walk/workflow.py): signal-with-start of the one
`queue-walk/<control queue>` workflow."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy

from contracts.task_queues import Queues
from workflows.queue_walk.workflow import QueueWalkInput, QueueWalkWorkflow, workflow_id


async def ask_for_admission_pass(client: Client, queues: Queues, reason: str) -> None:
    """Start the pass, or, while one runs, ask it for one more. Returns once Temporal has the ask; the pass runs on
    the control worker."""
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
