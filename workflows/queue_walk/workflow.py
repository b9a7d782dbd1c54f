"""The queue walk: admission passes over every region's queue, asked for when capacity may have grown outside an
allocation's own steps: a fleet apply, a node uncordoned, an agent whose report makes slots usable again.

Releases, cancels and lifted quarantines run their region's admission pass in their own step
(activities/control/claims.py); the reconciler runs one over every queue each minute, for what nothing announced.
This workflow is the announcement for the rest, so a request waiting for a node an operator just returned is placed
now, not within a minute:

    1. admit_queued        an admission pass over every region's queue (activities/control/admission.py)
    2. again, while asked  an `again` signal that arrived during the pass asks for one more: the pass may have read
                           the inventory before the change that signalled

One workflow id per control queue (`queue-walk/<control queue>`), started with signal-with-start
(`workflows.queue_walk.client.ask_for_admission_pass`): an ask while a pass runs is a signal to it, never a second
workflow, and never lost (Temporal refuses to complete a workflow that has a signal it has not seen).
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import AdmitInput
    from contracts.task_queues import Queues
    from workflows import control_calls

PASSES_PER_RUN = 100  # then continue as new, with what is still asked: the history stays short


class QueueWalkInput(BaseModel):
    queues: Queues
    asked: list[str] = Field(default_factory=list)  # asks carried over from the run before


def workflow_id(queues: Queues) -> str:
    """One per control queue: two Berth installations sharing a Temporal namespace admit from their own queues. The
    id keeps the workflow's first name: a running cluster's asks must reach the workflow already running."""
    return f"queue-walk/{queues.control}"


@workflow.defn(name="QueueWalk")
class QueueWalkWorkflow:
    def __init__(self) -> None:
        self.asked: list[str] = []  # why, since the last pass began

    @workflow.signal
    def again(self, reason: str) -> None:
        self.asked.append(reason)

    @workflow.run
    async def run(self, input: QueueWalkInput) -> int:
        self.asked = [*input.asked, *self.asked]
        passes = 0
        while self.asked:
            if passes == PASSES_PER_RUN:
                workflow.continue_as_new(QueueWalkInput(queues=input.queues, asked=self.asked))
            workflow.set_current_details(f"admission pass over every queue: {'; '.join(self.asked[:5])}")
            self.asked = []
            await control_calls.on_control(
                input.queues,
                steps.admit_queued,
                AdmitInput(),
                start_to_close=control_calls.ADMISSION_PASS_TIMEOUT,
                retry=control_calls.PASS_RETRY,
            )
            passes += 1
        return passes
