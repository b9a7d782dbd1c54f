"""What the stack wrote that a benchmark reads back: its allocations' states and the times of their trail's steps.

The rows are what a client sees (`GET /v1/allocations/{id}` reads the allocation's row), and the trail's times are
PostgreSQL's clock, the same host's as the benchmark's and Temporal's, so times from both can be subtracted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


async def allocation_states(sessions: async_sessionmaker[AsyncSession], ids: Sequence[str]) -> Counter[str]:
    """How many of these allocations' rows are in each state (one not written yet is in none)."""
    async with sessions() as session:
        rows = await session.execute(
            text("SELECT state, count(*) FROM allocations WHERE id = ANY(:ids) GROUP BY state"), {"ids": list(ids)}
        )
        return Counter(dict(rows.all()))


async def failure_reasons(sessions: async_sessionmaker[AsyncSession], ids: Sequence[str]) -> dict[str, int]:
    """How many of these allocations failed with each reason."""
    async with sessions() as session:
        rows = await session.execute(
            text(
                "SELECT failure_reason, count(*) FROM allocations WHERE id = ANY(:ids) AND state = 'failed' "
                "GROUP BY failure_reason"
            ),
            {"ids": list(ids)},
        )
        return dict(rows.all())


async def step_times(
    sessions: async_sessionmaker[AsyncSession], *, ids: Sequence[str] | None = None, steps: Sequence[str] | None = None
) -> dict[str, dict[str, float]]:
    """allocation -> step -> the first time its trail recorded that step (epoch seconds), for these allocations and
    steps (every one, where None)."""
    where, parameters = [], {}
    if ids is not None:
        where.append("allocation_id = ANY(:ids)")
        parameters["ids"] = list(ids)
    if steps is not None:
        where.append("step = ANY(:steps)")
        parameters["steps"] = list(steps)
    condition = f"WHERE {' AND '.join(where)} " if where else ""
    async with sessions() as session:
        rows = await session.execute(
            text(f"SELECT allocation_id, step, min(at) FROM allocation_events {condition}GROUP BY 1, 2"), parameters
        )
    found: dict[str, dict[str, float]] = {}
    for allocation_id, step, at in rows:
        found.setdefault(allocation_id, {})[step] = at.timestamp()
    return found
