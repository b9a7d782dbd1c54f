"""A cancellation that arrives with the result of the step the workflow awaits must still end the hold after it.

The SDK erases a workflow's cancellation when the cancel request arrives in the same activation as the result of
a child workflow (or a signal to another workflow) that the workflow awaits (sdk-python#620; activities are spared
by a logic flag). A plain `wait_condition` after that step then waits for ever, and Berth's holds
(`workflows.cancellation.wait_unless_cancelled`) must not.

Whether a live run puts the two in one activation depends on timing, so the behaviour is pinned by replaying a
recorded history in which they are (`sdk_histories/cancellation_with_child_result.json`, recorded with temporalio 1.35
by running `_cancel_with_the_result` below until the server delivered both in one workflow task): the guarded hold
replays it (the hold ends, the teardown after it runs, the run ends cancelled), and the plain wait does not (no
teardown: a nondeterminism error at the teardown's timer), which is the SDK's bug. The day
the SDK stops swallowing the cancellation, that second test fails and the workaround can go. The live test runs the
scenario end to end and asserts only what holds whatever the timing: the guarded run ends cancelled.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

with workflow.unsafe.imports_passed_through():
    from workflows.cancellation import wait_unless_cancelled

RECORDED = Path(__file__).with_name("sdk_histories") / "cancellation_with_child_result.json"


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


async def _step_then_hold(hold: Callable[[], Awaitable[None]]) -> str:
    """Await the step, then hold until cancelled, then tear down (a short timer stands in for a saga's compensation:
    it puts a command after the hold into the history, so a replay checks that the hold ended)."""
    await workflow.execute_child_workflow(
        Step.run, id=f"{workflow.info().workflow_id}-step", task_queue=workflow.info().task_queue + ".step"
    )
    try:
        await hold()
    except asyncio.CancelledError:
        await workflow.sleep(timedelta(milliseconds=10))
        raise
    return "held"


@workflow.defn(name="CancellationProbe")
class HoldAfterStep:
    """Berth's way: the hold after the step wakes on a cancellation the step's await swallowed."""

    @workflow.run
    async def run(self, guarded: bool) -> str:
        return await _step_then_hold(lambda: wait_unless_cancelled(lambda: False))


@workflow.defn(name="CancellationProbe")
class PlainHoldAfterStep:
    """The same workflow with a plain `wait_condition` as its hold (only ever replayed)."""

    @workflow.run
    async def run(self, guarded: bool) -> str:
        return await _step_then_hold(lambda: workflow.wait_condition(lambda: False))


async def _until(check: Callable[[], Awaitable[bool]], seconds: float = 60) -> None:
    """Poll `check` until it holds; the bound only turns a hang into a failure, it decides nothing."""
    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the probe never got there")


def _has(handle: WorkflowHandle[Any, Any], event: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return any(e.HasField(event) for e in (await handle.fetch_history()).events)

    return check


async def _cancel_with_the_result(client: Client, guarded: bool = True) -> WorkflowHandle[HoldAfterStep, str]:
    """Start the probe, stop its worker while the step runs, finish the step and cancel the run, then start a fresh
    worker: it usually gets the step's result and the cancel request in one activation."""
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

        await _until(ended)
    return handle


def _recorded() -> WorkflowHistory:
    recorded = WorkflowHistory.from_json("", RECORDED.read_text())
    child = next(e for e in recorded.events if e.HasField("start_child_workflow_execution_initiated_event_attributes"))
    probe = child.start_child_workflow_execution_initiated_event_attributes.workflow_id.removesuffix("-step")
    history = WorkflowHistory.from_json(probe, RECORDED.read_text())
    kinds = [event.WhichOneof("attributes") for event in history.events]
    completed = kinds.index("child_workflow_execution_completed_event_attributes")
    requested = kinds.index("workflow_execution_cancel_requested_event_attributes")
    assert "workflow_task_completed_event_attributes" not in kinds[completed:requested], "not one activation"
    assert kinds[-1] == "workflow_execution_canceled_event_attributes"
    assert "timer_started_event_attributes" in kinds[requested:]  # the teardown ran after the hold
    return history


async def test_a_cancellation_swallowed_with_a_steps_result_still_ends_the_hold() -> None:
    replayer = Replayer(workflows=[HoldAfterStep], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(_recorded())  # raises if the run would not end cancelled as recorded


async def test_the_sdk_still_swallows_it_for_a_plain_wait() -> None:
    replayer = Replayer(workflows=[PlainHoldAfterStep], data_converter=pydantic_data_converter)
    with pytest.raises(NondeterminismError, match="[Tt]imer"):
        await replayer.replay_workflow(_recorded())


async def test_a_cancel_during_the_step_ends_the_hold_live(temporal_env: WorkflowEnvironment) -> None:
    handle = await _cancel_with_the_result(temporal_env.client)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
