"""The agent's liveness, told to Temporal while any of its activities runs: a background heartbeat.

A node call is scheduled with a heartbeat timeout (`workflows.node_calls.NODE_HEARTBEAT`) so that an agent killed,
or cut off with the Temporal server, while it runs a step is noticed within seconds and the step retried on the
agent that comes back, instead of when the step's start-to-close timeout passes (minutes for a VM create: the
277 s one allocation waited after a chaos run's agent kill). A step's own code cannot heartbeat while it
is blocked in a driver call, so this interceptor heartbeats for it from the worker's event loop, every third of the
timeout, for as long as the step runs. It says "this agent process is alive and running the step"; the
start-to-close timeout still bounds a step that hangs in a live agent.

The heartbeat repeats the details the step itself last recorded (`wait_ready`'s readiness report), so a retry that
reads them sees the step's own account, not a blank.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

BEATS_PER_TIMEOUT = 3  # the SDK throttles sends to 0.8 x the timeout; a beat every third keeps each send due


class HeartbeatWhileRunning(Interceptor):
    """Heartbeat every activity scheduled with a heartbeat timeout, from start to end."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Outbound(ActivityOutboundInterceptor):
    """Remembers the details the step last heartbeated, to repeat them."""

    def __init__(self, next: ActivityOutboundInterceptor) -> None:
        super().__init__(next)
        self.details: Sequence[Any] = ()

    def heartbeat(self, *details: Any) -> None:
        self.details = details
        super().heartbeat(*details)


class _Inbound(ActivityInboundInterceptor):
    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self.outbound = _Outbound(outbound)
        super().init(self.outbound)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        timeout = activity.info().heartbeat_timeout
        if not timeout:
            return await super().execute_activity(input)
        beating = asyncio.create_task(self._beat(timeout.total_seconds() / BEATS_PER_TIMEOUT))
        try:
            return await super().execute_activity(input)
        finally:
            beating.cancel()

    async def _beat(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            self.outbound.heartbeat(*self.outbound.details)
