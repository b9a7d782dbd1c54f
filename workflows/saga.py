"""Undo steps that survive cancellation (docs/design.md, "Temporal practice": sagas), shared by the allocation, deployment and replica
workflows."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


async def shielded(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` to completion even if the workflow is cancelled meanwhile; re-raise the cancel afterwards.

    Compensations and teardown must never be cut short: a half-run undo is how capacity leaks."""
    try:
        task = asyncio.ensure_future(work)
    except BaseException:
        # The worker is evicting this run from its cache (shutdown): nothing may be scheduled now. The run is not
        # over; it resumes from its history on the next worker, compensation included.
        work.close()
        raise
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

    def discard(self, name: str) -> None:
        """Drop the newest undo step of that name: the step it would undo turned out to have done nothing."""
        for index in range(len(self.steps) - 1, -1, -1):
            if self.steps[index][0] == name:
                del self.steps[index]
                return

    async def compensate(self) -> None:
        async def undo_all() -> None:
            while self.steps:
                _name, undo = self.steps.pop()
                await undo()

        await shielded(undo_all())
