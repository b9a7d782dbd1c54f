"""What every part of an allocation run stands on: the move to a new state, the calls out (control steps with the
unwritten audit trail and the state's deadline, node steps with the run's pickup timeout) and the compensations
that give back what an attempt or a hold took (step 6 of workflow.py: releasing claims walks the region's queue).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import LeaveQueueInput, QuarantineInput, ReleaseClaimsInput, TeardownInput
    from workflows import node_calls
    from workflows.allocation.deadlines import StateClock
    from workflows.allocation.failures import node_failure, past_overall_timeout
    from workflows.allocation.mirror import Mirror
    from workflows.allocation.state import RunState
    from workflows.recovery.workflow import SlotRecoveryInput, SlotRecoveryWorkflow

R = TypeVar("R")


class Calls:
    def __init__(self, state: RunState, mirror: Mirror, clock: StateClock) -> None:
        self.state = state
        self.mirror = mirror  # the status as the world sees it: the Temporal UI and the audit trail (mirror.py)
        self.clock = clock  # the deadline of the state it is in (deadlines.py)

    def set_state(self, state: str, step: str, **details: Any) -> None:
        """Move to a state: its deadline's clock, and what the world sees of it (mirror.py)."""
        if state != self.state.status.state:
            self.clock.restart()
        self.mirror.move(state, step, **details)

    # -- control and node calls ---------------------------------------------------------------------------------------

    async def on_control(
        self, step: Callable[[Any], Awaitable[R]], argument: BaseModel, *, deadline: timedelta | None = None
    ) -> R:
        """Run a control step with the unwritten audit trail (mirror.py). `deadline`: what is left of the state's
        deadline; past it, with every retry, the state's deadline has passed."""
        try:
            return await self.mirror.control_step(step, argument, deadline)
        except ActivityError as error:
            if deadline is not None and past_overall_timeout(error):
                raise self.clock.passed(self.state.status.node) from error
            raise

    async def on_node(self, node: str, step: Callable[[Any], R], argument: BaseModel, **options: Any) -> R:
        """A node step on the node's agent, with this allocation's pickup timeout (workflows/node_calls.py)."""
        input = self.state.input
        pickup = timedelta(seconds=input.timing.agent_pickup_seconds)
        return await node_calls.on_node(input.queues, node, step, argument, pickup=pickup, **options)

    # -- giving back --------------------------------------------------------------------------------------------------

    async def release_claims(self, attempt: int | None) -> None:
        """6: the step that frees the capacity walks the region's queue too."""
        release = ReleaseClaimsInput(
            allocation_id=self.state.input.allocation_id, attempt=attempt, walk_region=self.state.status.region
        )
        await self.on_control(steps.release_claims, release)

    async def destroy_vm(
        self, node: str, attempt: int, slot_indexes: list[int], *, deadline: timedelta | None = None
    ) -> None:
        """Destroy and wipe on the node; if the node cannot be reached, or not within `deadline` (a release's),
        quarantine its slots and leave a recovery workflow waiting for the agent to come back and confirm the wipe."""
        input = self.state.input
        teardown = TeardownInput(allocation_id=input.allocation_id, node=node, slot_indexes=slot_indexes)
        try:
            await self.on_node(
                node,
                steps.destroy_vm,
                teardown,
                attempts=input.timing.teardown_attempts,
                start_to_close=timedelta(minutes=2),
                deadline=deadline,
            )
            return
        except ActivityError as error:
            failure = self.clock.failure_on(error, node) if deadline is not None else node_failure(error, node)
        quarantine = QuarantineInput(
            allocation_id=input.allocation_id,
            attempt=attempt,
            node=node,
            slot_indexes=slot_indexes,
            reason=f"wipe not confirmed: {failure.reason}",
        )
        await self.on_control(steps.quarantine_slots, quarantine)
        await workflow.start_child_workflow(
            SlotRecoveryWorkflow.run,
            SlotRecoveryInput(teardown=teardown, queues=input.queues),
            id=f"recovery/{node}/{input.allocation_id}/{attempt}",
            task_queue=input.queues.control,
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"wipe {len(slot_indexes)} slot(s) of {node} when its agent returns",
        )

    async def leave_queue(self) -> None:
        """Out of the region's queue (timed out, cancelled, refused for good), if it is in one; a StrictFIFO queue
        may let those behind it pass now, so the step walks the queue again."""
        if self.state.in_queue:
            leave = LeaveQueueInput(allocation_id=self.state.input.allocation_id, region=self.state.status.region)
            await self.on_control(steps.leave_queue, leave)
            self.state.in_queue = False
