"""Calling a control step from a workflow: every workflow does it through here, as every node step goes through
`node_calls.py`.

A control step runs on the control worker (`activities/`). The allocation's and the reservation's steps are local
activities, run by the worker that runs the workflow (no task-queue round trip, no activity task on the server);
the deployment's, the replica's, the reconciler's and slot recovery's are activities on the control queue. Each try
is bounded by `CONTROL_TIMEOUT` and the step is retried until it is done, at most `CONTROL_RETRY`'s 10 s apart. The
other options below are for the callers whose steps differ, each with why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from contracts.task_queues import Queues

R = TypeVar("R")

CONTROL_TIMEOUT = timedelta(seconds=30)  # each try of a control step: a PostgreSQL transaction or a cluster call
CONTROL_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=10))  # until done; a failing step is tried every 10 s
# A deployment's own steps get twice as long a try: `plan_deployment` reads the observed state of every cluster and
# runs the fleet scheduler over it in one step, where a replica's step touches one cluster.
DEPLOYMENT_TIMEOUT = timedelta(seconds=60)
# A pass gives up after five tries, and the next pass looks again from scratch: the reconciler's steps (its
# schedule skips a run while the last one is still going, so a pass stuck retrying would hold back every later one)
# and an announced admission pass (the reconciler's own pass admits within a minute what it failed to).
PASS_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=10), maximum_attempts=5)
# An admission pass reads and admits over every region's queue in one step.
ADMISSION_PASS_TIMEOUT = timedelta(minutes=1)
# Temporal's default policy (until done, backing off from 1 s to 100 s): a reservation's start and finish, and slot
# recovery's unquarantine. Each runs once per window or per recovered node, so a step that keeps failing may be
# tried less often than one a placement waits on.
DEFAULT_RETRY: RetryPolicy | None = None


async def on_control(
    queues: Queues,
    step: Callable[..., Awaitable[R]],
    *args: Any,
    start_to_close: timedelta = CONTROL_TIMEOUT,
    retry: RetryPolicy | None = CONTROL_RETRY,
    heartbeat: timedelta | None = None,
    cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
    summary: str | None = None,
) -> R:
    """Run the control step (a declaration of contracts/steps.py) as an activity on the control queue."""
    return await workflow.execute_activity(
        step,
        args=list(args),
        task_queue=queues.control,
        start_to_close_timeout=start_to_close,
        heartbeat_timeout=heartbeat,
        retry_policy=retry,
        cancellation_type=cancellation_type,
        summary=summary,
    )


async def local(
    step: Callable[..., Awaitable[R]],
    *args: Any,
    retry: RetryPolicy | None = CONTROL_RETRY,
    deadline: timedelta | None = None,
) -> R:
    """Run the control step as a local activity. `deadline` bounds it with every retry (a schedule-to-close
    timeout, no timer of the workflow's own)."""
    return await workflow.execute_local_activity(
        step,
        args=list(args),
        schedule_to_close_timeout=deadline,
        start_to_close_timeout=CONTROL_TIMEOUT,
        retry_policy=retry,
    )
