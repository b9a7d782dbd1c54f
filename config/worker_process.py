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
from pathlib import Path

from temporalio.worker import Worker

LIVENESS_SECONDS = 10.0  # how often the liveness file is touched; a probe allows several times this


async def run_until_signalled(
    workers: Sequence[Worker],
    background: Sequence[asyncio.Task[None]] = (),
    ready: Callable[[], None] | None = None,
    alive: Path | None = None,
) -> None:
    """Run the workers until SIGINT or SIGTERM; `ready` is called once they have all started (a supervisor's cue),
    and from then on `alive` (a file) is touched while the event loop turns (a Kubernetes probe reads its age:
    deploy/kubernetes). Leaving, each worker shuts down gracefully (running activities get its graceful shutdown
    timeout to finish), then the background tasks are cancelled."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = list(background)
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        if ready is not None:
            ready()
        if alive is not None:
            tasks.append(asyncio.create_task(_keep_touching(alive)))
        await stop.wait()
    for task in tasks:
        task.cancel()


async def _keep_touching(path: Path) -> None:
    """A file's mtime bumped from the event loop itself: a loop that stops turning stops touching it."""
    path.parent.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before the loop
    while True:
        path.touch()  # noqa: ASYNC240 - a metadata write of a tmpfs file: cheaper than handing it to a thread
        await asyncio.sleep(LIVENESS_SECONDS)
