"""What the thin client modules (`workflows.allocation.client`, `workflows.deployment.client`) share: every call
that needs a worker to answer is bounded, because Temporal would otherwise wait for one for ever (sdk-python#514)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio.client import RPCTimeoutOrCancelledError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

T = TypeVar("T")


class WorkerUnavailable(RuntimeError):
    """No worker answered in time: the control plane is down or overloaded."""


class Rejected(RuntimeError):
    """The workflow refused the action (for example, releasing an allocation that is not active). `state`: the
    state the workflow was in when it refused, where the refusal names one."""

    def __init__(self, message: str, state: str | None = None) -> None:
        super().__init__(message)
        self.state = state


async def bounded(call: Awaitable[T], wait_seconds: float) -> T:
    """`call`, or `WorkerUnavailable` when no worker answers within `wait_seconds`.

    Cut short, an update call does not end in `TimeoutError` but in the SDK's own `RPCTimeoutOrCancelledError`
    (which used to escape as an unhandled error and a "Task exception was never retrieved"); both mean the same."""
    try:
        return await asyncio.wait_for(call, wait_seconds)
    except (TimeoutError, RPCTimeoutOrCancelledError):
        raise WorkerUnavailable(
            "no Berth control worker answered in time; is `berth worker control` running?"
        ) from None


def refusal(error: WorkflowUpdateFailedError) -> Rejected:
    """An update's refusal in the workflow's own words; the state it refused in where the refusal carries one (the
    allocation workflow's `InvalidState` has it as its detail)."""
    cause = error.cause
    while cause is not None and not isinstance(cause, ApplicationError) and cause.__cause__ is not None:
        cause = cause.__cause__
    message = getattr(cause, "message", None) or str(cause or error)
    details = cause.details if isinstance(cause, ApplicationError) else ()
    state = details[0] if details and isinstance(details[0], str) else None
    return Rejected(message, state)
