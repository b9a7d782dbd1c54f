"""Reporting for `berth worker agents` (several simulated hosts in one process, as `berth up` runs them).

    workers poll ─► each host: first report, retried every 0.2 s ─► the reporter's own loop (heartbeats, changes)
                                     └── every host answered ─► ready file

The first report is retried quickly because the API may be starting beside the agents (the reporter's loop waits
seconds between tries), and it is never sent twice at once: the reporter's loop starts only after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from agent.reporter import NodeReporter, ReportRefused
from devstack.ready import mark_ready

log = logging.getLogger("berth.agent")
FIRST_REPORT_RETRY_SECONDS = 0.2


async def _report(reporter: NodeReporter, answered: asyncio.Event) -> None:
    while reporter.last_reply is None:
        try:
            await reporter.report_once()
        except ReportRefused as refused:
            log.error("node %s: not ready: %s", reporter.agent.node, refused)
            break
        except Exception:  # noqa: BLE001 - the API is not up yet
            await asyncio.sleep(FIRST_REPORT_RETRY_SECONDS)
    if reporter.last_reply is not None:
        answered.set()
    await reporter.run()


def reporting(reporters: list[NodeReporter], ready_file: Path | None) -> Callable[[], None]:
    """The `ready` callback for agent.serve.run_nodes: starts every host's reports, and writes the ready file once each
    host's first report was answered (the first request then finds every node live)."""
    tasks: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references to tasks

    async def announce() -> None:
        answered = [asyncio.Event() for _ in reporters]
        tasks.update(asyncio.create_task(_report(r, event)) for r, event in zip(reporters, answered, strict=True))
        await asyncio.gather(*(event.wait() for event in answered))
        if ready_file is not None:
            mark_ready(ready_file)

    return lambda: tasks.add(asyncio.create_task(announce()))
