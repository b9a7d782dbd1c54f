"""Waiting until something holds: a process ready, an allocation's row in the state a benchmark waits for.

A benchmark learns what the stack did the way a client does, by asking again: `until` asks every so often, gives up
after a while with what it was waiting for, and lets a check that can tell it will never hold (its process exited,
an allocation failed) raise at once instead of sitting out the time.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.rows import allocation_states, failure_reasons
from contracts.allocation import FINAL_STATES

T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[T | None]],
    *,
    every: float,
    timeout: float | None = None,
    what: str = "the condition",
    detail: Callable[[], Awaitable[str]] | None = None,
) -> T:
    """Call `check` every `every` seconds until it returns something true (not None, False or 0), and return that.
    Past `timeout` seconds (never, with None) raise TimeoutError naming `what`, and `detail()` when given: the state
    it was left in."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not (found := await check()):
        if deadline is not None and time.monotonic() > deadline:
            left = f": {await detail()}" if detail is not None else ""
            raise TimeoutError(f"{what} did not happen within {timeout:g}s{left}")
        await asyncio.sleep(every)
    return found


async def settled(
    sessions: async_sessionmaker[AsyncSession],
    ids: Sequence[str],
    states: tuple[str, ...],
    *,
    every: float = 0.05,
    timeout: float = 600,
    what: str = "allocations settling",
) -> None:
    """Wait until every one of these allocations' rows is in one of `states`, read as `GET /v1/allocations/{id}`
    reads it. One that ended otherwise (failed while they were to become active, say) raises at once: a final state
    is never left, so the wait could only run out."""
    seen: Counter[str] = Counter()

    async def check() -> bool:
        nonlocal seen
        seen = await allocation_states(sessions, ids)
        if any(state in FINAL_STATES and state not in states for state in seen):
            raise RuntimeError(f"{what}: {await left()}")
        return sum(seen[state] for state in states) == len(ids)

    async def left() -> str:
        return f"not all {states}: {dict(seen)}; failures: {await failure_reasons(sessions, ids)}"

    await until(check, every=every, timeout=timeout, what=what, detail=left)
