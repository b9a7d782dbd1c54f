"""Agents' steady reports, taken in without a database write each.

Most reports are heartbeats from an agent whose host and approval the control plane already has. Those are answered
from memory and written in batches: one statement per flush, whatever the number of agents (`store.liveness.
record_heartbeats`). A report is steady only if this process confirmed the same topology and approval for that node,
and the node's approval has not changed since (each flush asks PostgreSQL which nodes' approval changed since the
last one: an indexed range that is almost always empty); anything else (a new host, a new approval, an agent this
process has not seen) goes the full way through `store.node_reports.record_report`.

Flushing is lazy: the first report after `flush_every` seconds writes everything buffered, so an idle API holds no
timer, and a busy one writes about once a second.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from scheduler.host.report import NodeReport
from store.liveness import record_heartbeats
from store.node_reports import approvals_changed_since

CLOCK_SLACK = timedelta(seconds=5)


class Heartbeats:
    def __init__(self, flush_every: float = 1.0) -> None:
        self.flush_every = flush_every
        self._known: dict[str, tuple[str, str | None]] = {}  # node -> (topology, approval) confirmed in full
        self._pending: dict[str, tuple[datetime, float]] = {}  # node -> (seen at, interval)
        # When this process last looked for changed approvals; the first look goes back to its start. Looks overlap
        # by a few seconds: approval times are written with the writer's clock.
        self._checked_at = datetime.now(UTC)
        self._flushed_at = time.monotonic()
        self._lock = asyncio.Lock()
        self.flushes = 0

    def steady(self, node: str, report: NodeReport) -> bool:
        return report.host is None and self._known.get(node) == (report.topology, report.approved)

    def confirm(self, node: str, topology: str, approved: str) -> None:
        self._known[node] = (topology, approved)

    def add(self, node: str, seen: datetime, interval: float) -> None:
        self._pending[node] = (seen, interval)

    async def maybe_flush(self, sessions: async_sessionmaker[AsyncSession], *, force: bool = False) -> None:
        if not force and time.monotonic() - self._flushed_at < self.flush_every:
            return
        async with self._lock:
            if not force and time.monotonic() - self._flushed_at < self.flush_every:
                return
            beats, self._pending = self._pending, {}
            self._flushed_at = time.monotonic()
            async with sessions.begin() as session:
                checked_at = await session.scalar(select(func.now()))
                await record_heartbeats(session, [(node, seen, every) for node, (seen, every) in beats.items()])
                changed = await approvals_changed_since(session, self._checked_at - CLOCK_SLACK)
            for node, approved in changed.items():
                known = self._known.get(node)
                if known is not None and known[1] != approved:
                    del self._known[node]  # its next report goes the full way and gets the new slots
            self._checked_at = checked_at
            self.flushes += 1
