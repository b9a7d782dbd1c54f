"""Agents' steady reports, taken in without a database write each.

Most reports are heartbeats from an agent whose host and approval the control plane already has. Those are answered
from memory and written in batches: one statement per flush, whatever the number of agents (`store.liveness.
record_heartbeats`). A report is steady only if this process confirmed the same topology and approval for that node,
and the node's approval has not changed since: each flush reads back the approval hash of the nodes it wrote and
forgets those whose approval moved (or whose node is gone), so their next report goes the full way through
`store.node_reports.record_report` and brings the agent its new slots. A repair voids the approval
(`store.nodes.repair_slots`) for the same reason: every API process forgets the node, not only the one that served
the repair, and the agent is asked for its verdicts again. The cost follows the batch, not the fleet.

Flushing is lazy: the first report after `flush_every` seconds writes everything buffered, so an idle API holds no
timer, and a busy one writes about once a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime

from scheduler.host.report import NodeReport
from store.db import AsyncSession, async_sessionmaker
from store.liveness import record_heartbeats

log = logging.getLogger("berth.api")


class Heartbeats:
    def __init__(self, flush_every: float = 1.0) -> None:
        self.flush_every = flush_every
        self._known: dict[str, tuple[str, str | None]] = {}  # node -> (topology, approval) confirmed in full
        self._pending: dict[str, tuple[datetime, float]] = {}  # node -> (seen at, interval)
        self._flushed_at = time.monotonic()
        self._lock = asyncio.Lock()
        self.flushes = 0

    def steady(self, node: str, report: NodeReport) -> bool:
        return (
            report.host is None
            and report.health is None
            and self._known.get(node) == (report.topology, report.approved)
        )

    def confirm(self, node: str, topology: str, approved: str) -> None:
        self._known[node] = (topology, approved)

    def forget(self, node: str) -> None:
        """The node's next report goes the full way through `record_report` (after a repair, say)."""
        self._known.pop(node, None)

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
            try:
                async with sessions.begin() as session:
                    approvals = await record_heartbeats(
                        session, [(node, seen, every) for node, (seen, every) in beats.items()]
                    )
            except Exception:
                # Keep the beats for the next flush (newer ones win) rather than fail an agent's report for it.
                self._pending = beats | self._pending
                log.warning("could not write %d agent heartbeats; keeping them for the next flush", len(beats))
                return
            for node in beats:
                known = self._known.get(node)
                if known is not None and (node not in approvals or approvals[node] != known[1]):
                    del self._known[node]  # its next report goes the full way and gets the new slots
            self.flushes += 1
