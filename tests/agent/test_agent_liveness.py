"""The node agent's liveness heartbeat (agent/liveness.py), on a real Temporal server.

A step that blocks in a driver call for longer than its heartbeat timeout, without heartbeating itself, must not be
taken for a dead agent: the interceptor heartbeats for it, so it completes on its first try. The details the step
did record are the ones repeated, so a reader of the heartbeat (a retry, the Temporal UI) sees the step's own."""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from agent.liveness import HeartbeatWhileRunning

HEARTBEAT = timedelta(seconds=2)
BLOCKED_FOR = 3 * HEARTBEAT  # three heartbeat timeouts without a beat of its own


class BlockingStep:
    """A step stuck in a long call: it heartbeats once at the start, then blocks well past its heartbeat timeout."""

    def __init__(self) -> None:
        self.attempts: list[int] = []
        self.release = threading.Event()

    @activity.defn(name="liveness_probe_step")
    def run(self) -> str:
        self.attempts.append(activity.info().attempt)
        activity.heartbeat({"phase": "creating"})
        self.release.wait(BLOCKED_FOR.total_seconds())
        return "made"


@workflow.defn(name="LivenessProbe")
class Probe:
    @workflow.run
    async def run(self) -> str:
        return await workflow.execute_activity(
            "liveness_probe_step",
            result_type=str,
            start_to_close_timeout=timedelta(minutes=1),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=2),
        )


async def _details_after_a_beat_of_its_own(handle: WorkflowHandle[Any, Any]) -> Any:
    """The running step's heartbeat details, read once the interceptor has beaten (a second after the step's own)."""
    for _ in range(200):
        pending = (await handle.describe()).raw_description.pending_activities
        if pending and pending[0].HasField("last_heartbeat_time"):
            beaten = pending[0].last_heartbeat_time.ToDatetime() - pending[0].last_started_time.ToDatetime()
            if beaten >= timedelta(seconds=1):
                return pydantic_data_converter.payload_converter.from_payloads(pending[0].heartbeat_details.payloads)[0]
        await asyncio.sleep(0.05)
    raise AssertionError("the step was never heartbeaten past its own beat")


async def test_a_step_blocked_longer_than_its_heartbeat_timeout_is_kept_alive(temporal_client: Client) -> None:
    step = BlockingStep()
    queue = f"liveness-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(2) as executor:
        async with Worker(
            temporal_client,
            task_queue=queue,
            workflows=[Probe],
            activities=[step.run],
            activity_executor=executor,
            interceptors=[HeartbeatWhileRunning()],
            max_heartbeat_throttle_interval=timedelta(milliseconds=200),
        ):
            handle = await temporal_client.start_workflow(Probe.run, id=queue, task_queue=queue)
            assert await _details_after_a_beat_of_its_own(handle) == {"phase": "creating"}
            assert await handle.result() == "made"
    assert step.attempts == [1]  # never timed out, never retried
    started = [e for e in (await handle.fetch_history()).events if e.HasField("activity_task_started_event_attributes")]
    assert [e.activity_task_started_event_attributes.attempt for e in started] == [1]
