"""QueueWalk: an admission pass over every region's queue, asked for when capacity may have grown outside an
allocation's own steps (issue 24): a fleet apply, a node uncordoned, an agent whose report makes slots usable again.

Releases, cancels and lifted quarantines walk their region's queue in their own step (activities/control/claims.py);
the reconciler walks every queue each minute, for what nothing announced. This workflow is the announcement for the
rest, so a request waiting for a node an operator just returned is placed now, not within a minute:

    1. admit_queued        walk every region's queue (activities/control/admission.py)
    2. again, while asked  an `again` signal that arrived during the walk asks for one more: the walk may have read
                           the inventory before the change that signalled

One workflow id per control queue (`queue-walk/<control queue>`), started with signal-with-start (`queue_walk_client.walk_queues`): a request while
one walks is a signal to it, never a second workflow, and never lost (Temporal refuses to complete a workflow
that has a signal it has not seen).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import AdmitInput
    from contracts.task_queues import Queues

WALK_TIMEOUT = timedelta(minutes=1)
WALK_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=10), maximum_attempts=5)  # then the reconciler's walk
WALKS_PER_RUN = 100  # then continue as new, with what is still asked: the history stays short


class QueueWalkInput(BaseModel):
    queues: Queues
    asked: list[str] = Field(default_factory=list)  # asks carried over from the run before


def workflow_id(queues: Queues) -> str:
    """One per control queue: two Berth installations sharing a Temporal namespace walk their own queues."""
    return f"queue-walk/{queues.control}"


@workflow.defn(name="QueueWalk")
class QueueWalkWorkflow:
    def __init__(self) -> None:
        self.asked: list[str] = []  # why, since the last walk began

    @workflow.signal
    def again(self, reason: str) -> None:
        self.asked.append(reason)

    @workflow.run
    async def run(self, input: QueueWalkInput) -> int:
        self.asked = [*input.asked, *self.asked]
        walks = 0
        while self.asked:
            if walks == WALKS_PER_RUN:
                workflow.continue_as_new(QueueWalkInput(queues=input.queues, asked=self.asked))
            workflow.set_current_details(f"walking every queue: {'; '.join(self.asked[:5])}")
            self.asked = []
            await workflow.execute_activity(
                steps.admit_queued,
                AdmitInput(),
                task_queue=input.queues.control,
                start_to_close_timeout=WALK_TIMEOUT,
                retry_policy=WALK_RETRY,
            )
            walks += 1
        return walks
