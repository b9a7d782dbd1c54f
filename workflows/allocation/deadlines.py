"""Per-state deadlines of an allocation (docs/design.md section 2): the longest it may stay in each state before it
compensates and fails with `DeadlineExceeded`.

A state's clock starts when the allocation enters it (`placing` again with each new list of candidates). A step is
given what is left as its schedule-to-close timeout, so a deadline costs no timer of the workflow's own; only a step
that may create something (a VM) and could outlast the deadline is raced against a timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.durations import format_duration
    from contracts.failures import DEADLINE_EXCEEDED
    from workflows import node_calls
    from workflows.allocation.failures import AttemptFailed, node_failure, past_overall_timeout
    from workflows.allocation.state import RunState

R = TypeVar("R")


class StateClock:
    def __init__(self, state: RunState) -> None:
        self.state = state  # the allocation's state, and each state's deadline (`RunState.deadlines`)
        self.pickup = timedelta(seconds=state.input.timing.agent_pickup_seconds)
        self.entered = workflow.now()  # when the current state's clock started

    def current_state(self) -> str:
        """The state the allocation is in, whose deadline runs."""
        return self.state.status.state

    def restart(self) -> None:
        self.entered = workflow.now()

    def time_left(self, node: str | None = None) -> timedelta | None:
        """What is left of the current state's deadline; None for a state without one. Already past it: the
        deadline's failure."""
        limit = self.state.deadlines.of(self.current_state())
        if limit is None:
            return None
        left = self.entered + timedelta(seconds=limit) - workflow.now()
        if left <= timedelta(0):
            raise self.passed(node)
        return left

    def passed(self, node: str | None) -> AttemptFailed:
        """The failure of a state that took longer than its deadline."""
        state = "placing" if self.current_state() == "pending" else self.current_state()
        limit = self.state.deadlines.of(state) or 0.0
        where = f" on node {node}" if node else ""
        return AttemptFailed(
            "deadline_exceeded", f"{state} took longer than {format_duration(limit)}{where}", final=DEADLINE_EXCEEDED
        )

    def failure_on(self, error: ActivityError, node: str) -> AttemptFailed:
        """A node call's failure: the state's deadline when that is what ended it, else the node's own reason."""
        return self.passed(node) if past_overall_timeout(error) else node_failure(error, node)

    def longest_node_call(self, start_to_close: timedelta, attempts: int) -> timedelta:
        """The longest a node call can take with every retry (each try waits for its pickup and runs for at most
        `start_to_close`; retries back off by at most NODE_RETRY_INTERVAL)."""
        return attempts * (self.pickup + start_to_close) + (attempts - 1) * node_calls.NODE_RETRY_INTERVAL

    async def race(self, node: str, call: Awaitable[R], longest: timedelta) -> R:
        """Race a step that may create something (a VM) against the state's deadline. Past it the step is cancelled
        and waited for (`WAIT_CANCELLATION_COMPLETED`), so the compensation never races a create still running.
        `longest`: the most the step can take with all its retries; where the deadline is further away than that,
        the race is already decided and its timer, an action of its own, is not started."""
        left = self.time_left(node)
        if left is None or longest < left:
            return await call
        running = asyncio.ensure_future(call)
        await workflow.wait([running], timeout=left.total_seconds())
        if running.done():
            return running.result()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        raise self.passed(node)
