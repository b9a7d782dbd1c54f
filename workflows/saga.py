"""Undo steps that survive cancellation (TEMPORAL.md, saga rules), for the deployment and replica workflows.

The allocation workflow has its own copy of the same two helpers; this module is the shared home for new workflows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def shielded(work: Awaitable[None]) -> None:
    """Run `work` to completion even if the workflow is cancelled meanwhile; re-raise the cancel afterwards.

    Compensations and teardown must never be cut short: a half-run undo is how capacity leaks."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError()


class Saga:
    """Undo steps registered before each step that can leave partial state; run newest first, shielded."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []

    def add(self, name: str, undo: Callable[[], Awaitable[None]]) -> None:
        self.steps.append((name, undo))

    async def compensate(self) -> None:
        async def undo_all() -> None:
            while self.steps:
                _name, undo = self.steps.pop()
                await undo()

        await shielded(undo_all())
