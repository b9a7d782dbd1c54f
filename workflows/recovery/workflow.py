"""Slot recovery: finish a teardown that could not reach its node, whenever the node agent comes back.

The allocation workflow does not wait for a dead host: it quarantines the host's slots and starts this workflow,
which queues the destroy-and-wipe on the node's task queue with a long pickup timeout. When the agent returns and
confirms the wipe, the slots go back into circulation; until then they are never handed out.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import SlotsInput, TeardownInput, TeardownResult
    from contracts.task_queues import Queues
    from workflows import control_calls, node_calls


class SlotRecoveryInput(BaseModel):
    teardown: TeardownInput
    queues: Queues = Queues()
    wait_for_agent_hours: float = 24 * 14


@workflow.defn(name="SlotRecovery")
class SlotRecoveryWorkflow:
    @workflow.run
    async def run(self, input: SlotRecoveryInput) -> TeardownResult:
        teardown = input.teardown
        workflow.set_current_details(
            f"waiting for the node agent of **{teardown.node}** to destroy the VM of {teardown.allocation_id} and "
            f"wipe slots {teardown.slot_indexes}; those slots stay quarantined until then"
        )
        # No pickup timeout: the agent may be back in an hour or in days; the whole wait is bounded instead.
        result = await node_calls.on_node(
            input.queues,
            teardown.node,
            steps.destroy_vm,
            teardown,
            pickup=None,
            deadline=timedelta(hours=input.wait_for_agent_hours),
            start_to_close=timedelta(minutes=2),
            attempts=0,
            retry_interval=timedelta(minutes=1),
        )
        await control_calls.on_control(
            input.queues,
            steps.unquarantine_slots,
            SlotsInput(node=teardown.node, slot_indexes=teardown.slot_indexes),
            retry=control_calls.DEFAULT_RETRY,
        )
        return result
