"""The control worker's workflow sandbox still refuses what makes a workflow non-deterministic.

Every workflow of Berth runs in `worker.workflow_runner()`. These tests run, on that runner and a real Temporal
server, a workflow module that reads the host's clock, randomness and files (directly, and through a helper module
it imports), and one that reads the clock when it is imported: the first fails its workflow task with the sandbox's
`RestrictedWorkflowAccessError` (the run does not complete, and its history says why), the second cannot be
registered at all. A faster sandbox setting that loses either (`with_passthrough_all_modules()`, which runs the
worker's own copy of the workflow module, with the real `time` and `random`) fails here.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import RestrictedWorkflowAccessError

from tests.workflows.sandbox_probe.clock_at_import import ClockAtImport
from tests.workflows.sandbox_probe.reaches_out import REACHES, ReachesOut
from worker import workflow_runner

REFUSED = [reach for reach in REACHES if reach != "workflow.now"]


async def _first_task_failure(handle: WorkflowHandle[ReachesOut, str], within: float = 30.0) -> str:
    """The message of the run's first failed workflow task, waiting for it up to `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                return event.workflow_task_failed_event_attributes.failure.message
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                raise AssertionError("the workflow completed: the sandbox let it through")
        await asyncio.sleep(0.1)
    raise AssertionError(f"no workflow task failed within {within} s")


@pytest.fixture
async def sandboxed(temporal_client: Client):
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(temporal_client, task_queue=queue, workflows=[ReachesOut], workflow_runner=workflow_runner()):
        yield queue


@pytest.mark.parametrize("reach", REFUSED)
async def test_workflow_code_that_reaches_the_host_fails_its_task(temporal_client: Client, sandboxed: str, reach: str):
    handle = await temporal_client.start_workflow(
        ReachesOut.run, reach, id=f"sandbox-{uuid.uuid4()}", task_queue=sandboxed
    )
    message = await _first_task_failure(handle)
    await handle.terminate("the test has read the failure")  # a failed task is retried: the run stays open
    assert "Cannot access" in message and "from inside a workflow" in message, message


async def test_the_deterministic_way_runs(temporal_client: Client, sandboxed: str):
    handle = await temporal_client.start_workflow(
        ReachesOut.run, "workflow.now", id=f"sandbox-{uuid.uuid4()}", task_queue=sandboxed
    )
    assert "20" in await asyncio.wait_for(handle.result(), 30)  # a date, from the workflow's own clock


async def test_a_workflow_module_that_reads_the_clock_when_imported_is_not_registered(temporal_client: Client):
    with pytest.raises(RuntimeError, match="Failed validating workflow ClockAtImport") as refused:
        Worker(
            temporal_client, task_queue="sandbox-never", workflows=[ClockAtImport], workflow_runner=workflow_runner()
        )
    assert isinstance(refused.value.__cause__, RestrictedWorkflowAccessError)
    assert "datetime.datetime.now" in str(refused.value.__cause__)
