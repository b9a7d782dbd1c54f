"""Waits that a swallowed cancellation still ends.

The SDK can lose a workflow's cancellation: when the cancel request arrives in the same activation as the result of
the operation the workflow is awaiting (a child workflow, a signal to or a cancel of another workflow; activities are
spared by a logic flag), the await returns the result and the cancellation of the workflow's task is erased
(sdk-python#620; the general fix sits behind a logic flag that temporalio 1.35 does not enable by default). The cancel request is delivered once, so a workflow
that then waits for something else (a release, a deletion, nothing at all) waits for ever, and whatever it holds
leaks: seen here as a deleted deployment whose replica, cancelled as it reported ready, never tore down.

The request itself is not lost: `workflow.cancellation_reason()` says it came. So every wait a cancellation must
end (the holds before teardown) also wakes on it, and raises the cancellation the await swallowed. A cancellation
delivered the usual way raises from the same wait, so histories replay unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow


def requested() -> bool:
    """Whether the server has asked this run to cancel (whether or not an await has raised it yet)."""
    return workflow.cancellation_reason() is not None


async def wait_unless_cancelled(condition: Callable[[], bool], at_most: timedelta | None = None) -> None:
    """`workflow.wait_condition(condition, timeout=at_most)`, raising `asyncio.CancelledError` when the run has been
    asked to cancel, even if the await that should have raised it swallowed it. Only for waits that precede the
    run's teardown: a wait inside the teardown would raise at once."""
    await workflow.wait_condition(lambda: condition() or requested(), timeout=at_most)
    if requested():
        raise asyncio.CancelledError()
