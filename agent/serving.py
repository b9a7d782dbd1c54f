"""Serving Temporal workers until the process is told to stop, for the control worker (worker.py) and the node agent
(agent/serve.py) alike.

It sits apart from both so that each can import it without the other: a node agent must not pull in the control
plane for it (agent/serve.py says why), so this module imports nothing of Berth's and only temporalio's
Worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence

from temporalio.worker import Worker


async def run_until_signalled(
    workers: Sequence[Worker], background: Sequence[asyncio.Task[None]] = (), ready: Callable[[], None] | None = None
) -> None:
    """Run the workers until SIGINT or SIGTERM; `ready` is called once they have all started (a supervisor's cue).
    Leaving, each worker shuts down gracefully (running activities get its graceful shutdown timeout to finish),
    then the background tasks are cancelled."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        if ready is not None:
            ready()
        await stop.wait()
    for task in background:
        task.cancel()
