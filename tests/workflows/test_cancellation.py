"""A cancellation that arrives with the result of the step the workflow awaits must still end the hold after it.

Reproduced as sdk-python#352 describes: the workflow's worker is stopped while its step (a child workflow) runs
elsewhere; the step completes and the cancel request comes; a new worker then gets both in one activation. The SDK
erases the cancellation there (sdk-python#620; activities are spared by a logic flag, child workflows and signals to
other workflows are not), so a plain `wait_condition` after the step waits for ever, and Berth's holds
(`workflows.cancellation.wait_unless_cancelled`) must not. The plain variant is asserted too: the day the SDK stops
swallowing the cancellation it fails, and the workaround can go.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from workflows.cancellation import wait_unless_cancelled


@workflow.defn(name="CancellationProbeStep")
class Step:
    """The step the probe awaits: a child workflow that finishes when told to."""

    def __init__(self) -> None:
        self.finished = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.finished)
        return "done"

    @workflow.signal
    def finish(self) -> None:
        self.finished = True


@workflow.defn(name="CancellationProbe")
class HoldAfterStep:
    @workflow.run
    async def run(self, guarded: bool) -> str:
        await workflow.execute_child_workflow(
            Step.run, id=f"{workflow.info().workflow_id}-step", task_queue=workflow.info().task_queue + ".step"
        )
        if guarded:
            await wait_unless_cancelled(lambda: False)
        else:
            await workflow.wait_condition(lambda: False)
        return "held"


async def _until(check: Callable[[], Awaitable[bool]], seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the probe never got there")


def _has(handle: WorkflowHandle[Any, Any], event: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return any(e.HasField(event) for e in (await handle.fetch_history()).events)

    return check


async def _cancel_with_the_result(client: Client, guarded: bool) -> WorkflowHandle[HoldAfterStep, str]:
    """Start the probe, stop its worker while the step runs, finish the step and cancel the run, then start a fresh
    worker: it gets the step's result and the cancel request in one activation."""
    queue = f"cancellation-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue + ".step", workflows=[Step]):
        async with Worker(client, task_queue=queue, workflows=[HoldAfterStep], max_cached_workflows=0):
            handle = await client.start_workflow(HoldAfterStep.run, guarded, id=queue, task_queue=queue)
            await _until(_has(handle, "child_workflow_execution_started_event_attributes"))
        await client.get_workflow_handle(f"{queue}-step").signal(Step.finish)
        await _until(_has(handle, "child_workflow_execution_completed_event_attributes"))
        await handle.cancel()
    async with Worker(client, task_queue=queue, workflows=[HoldAfterStep]):

        async def ended() -> bool:
            return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

        with contextlib.suppress(AssertionError):
            await _until(ended, seconds=3)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        await handle.terminate("test over: the probe held on")
    return handle


async def test_a_cancellation_swallowed_with_a_steps_result_still_ends_the_hold(
    temporal_env: WorkflowEnvironment,
) -> None:
    handle = await _cancel_with_the_result(temporal_env.client, guarded=True)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED


async def test_the_sdk_still_swallows_it_for_a_plain_wait(temporal_env: WorkflowEnvironment) -> None:
    handle = await _cancel_with_the_result(temporal_env.client, guarded=False)
    events = (await handle.fetch_history()).events
    assert any(e.HasField("workflow_execution_cancel_requested_event_attributes") for e in events)
    assert not any(e.HasField("workflow_execution_canceled_event_attributes") for e in events)
    assert events[-1].HasField("workflow_execution_terminated_event_attributes")  # held on until terminated
