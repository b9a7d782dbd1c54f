"""Asking the control plane for an admission pass when capacity may have grown through the API: a fleet apply, a
node uncordoned, an agent's report that brings its node or slots back. Without it a request waiting for a node an
operator just returned would wait for the reconciler's pass, up to a minute.

The ask is best effort and never delays or fails the route that made it: the inventory is already written, and the
reconciler runs an admission pass over every queue each minute anyway. One ask at a time per API process: asks that
come while one is in flight become a single next ask, so a burst (every agent reporting after an API restart) is two
Temporal calls, not hundreds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from api.temporal import ControlPlane
from workflows.queue_walk.client import ask_for_admission_pass

log = logging.getLogger(__name__)

MAX_REASONS = 5  # named in the pass's current details; the rest are counted


class AdmissionPasses:
    """This API process's asks for an admission pass, one in flight at a time (the app keeps one, in `Services`)."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self._reasons: list[str] = []
        self._sending: asyncio.Task[None] | None = None

    def ask(self, reason: str) -> None:
        """Ask for an admission pass over every queue; returns at once."""
        self._reasons.append(reason)
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send())

    async def close(self) -> None:
        """At shutdown: an ask still in flight is dropped (the reconciler's pass covers it)."""
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
                    await ask_for_admission_pass(client, self.control.queues, reason)
            except Exception as error:  # noqa: BLE001 - Temporal unreachable: the reconciler's minute covers it
                log.warning("could not ask for an admission pass (%s): %s", reason, error)
