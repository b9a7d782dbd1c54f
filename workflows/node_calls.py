"""Calling a node agent from a workflow: the allocation, slot-recovery and reconcile workflows do it the same way.

A node step runs on the node's own task queue (`berth.node.<node>`), where only that host's agent polls. An agent
that does not pick the task up within `pickup` is unreachable (a schedule-to-start timeout is never retried); one
that stops heartbeating is gone, and the call is retried (on the agent when it is back). `deadline` bounds the call
with every retry (a schedule-to-close timeout: no timer of the workflow's own).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from contracts.task_queues import Queues

R = TypeVar("R")

NODE_RETRY_INTERVAL = timedelta(seconds=5)  # the longest backoff between tries of a node call
# The heartbeat timeout of the allocation's node calls: the agent heartbeats while any step runs (agent/liveness.py),
# so an agent killed or cut off mid-step is noticed within this and the step retried, not after its start-to-close.
NODE_HEARTBEAT = timedelta(seconds=10)


async def on_node(
    queues: Queues,
    node: str,
    step: Callable[..., R],
    *args: Any,
    pickup: timedelta | None,
    start_to_close: timedelta = timedelta(seconds=30),
    heartbeat: timedelta | None = NODE_HEARTBEAT,
    attempts: int = 3,
    retry_interval: timedelta = NODE_RETRY_INTERVAL,
    deadline: timedelta | None = None,
    cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
    summary: str | None = None,
) -> R:
    """Run the node step (a declaration of contracts/steps.py) on `node`'s agent. `attempts` 0: no limit.
    `summary`: the step's line in the Temporal UI's timeline, `<step> on <node>` unless given."""
    return await workflow.execute_activity(
        step,
        args=list(args),
        task_queue=queues.node(node),
        schedule_to_start_timeout=pickup,
        schedule_to_close_timeout=deadline,
        start_to_close_timeout=start_to_close,
        heartbeat_timeout=heartbeat,
        retry_policy=RetryPolicy(maximum_attempts=attempts, maximum_interval=retry_interval),
        cancellation_type=cancellation_type,
        summary=summary or f"{step.__name__} on {node}",
    )
