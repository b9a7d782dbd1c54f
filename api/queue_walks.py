"""Asking the control plane for an admission pass when capacity may have grown through the API (issue 24): a
fleet apply, a node uncordoned, an agent's report that brings its node or slots back.

The ask is best effort and never delays or fails the route that made it: the inventory is already written, and the
reconciler walks every queue each minute anyway. One ask at a time per API process: asks that come while one is
in flight become a single next ask, so a burst (every agent reporting after an API restart) is two Temporal calls,
not hundreds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from api.temporal import ControlPlane
from workflows.queue_walk_client import walk_queues

log = logging.getLogger(__name__)

MAX_REASONS = 5  # named in the walk's current details; the rest are counted


class QueueWalks:
    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self._reasons: list[str] = []
        self._sending: asyncio.Task[None] | None = None

    def ask(self, reason: str) -> None:
        """Ask for a walk of every queue; returns at once."""
        self._reasons.append(reason)
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send())

    async def close(self) -> None:
        """At shutdown: an ask still in flight is dropped (the reconciler's walk covers it)."""
        if self._sending is not None and not self._sending.done():
            self._sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sending

    async def _send(self) -> None:
        while self._reasons:
            reasons, self._reasons = self._reasons, []
            reason = "; ".join(reasons[:MAX_REASONS])
            if len(reasons) > MAX_REASONS:
                reason += f"; and {len(reasons) - MAX_REASONS} more"
            try:
                client = await self.control.client()
                async with asyncio.timeout(self.control.timeouts.status_seconds):
                    await walk_queues(client, self.control.queues, reason)
            except Exception as error:  # noqa: BLE001 - Temporal unreachable: the reconciler's minute covers it
                log.warning("could not ask for a walk of the queues (%s): %s", reason, error)
