"""What the usage ledger billed an allocation, for tests that drive one through a real workflow."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store import usage
from store.models import UsageIntervalRow


async def billed(sessions: async_sessionmaker[AsyncSession], allocation_id: str) -> list[tuple[int, int, str | None]]:
    """(attempt, GPUs, why it ended: None while held) of each interval the ledger has for the allocation, and the
    ledger agrees with every claim to the second (store/usage.py's drift over the whole history)."""
    async with sessions() as session:
        rows = await session.execute(
            select(UsageIntervalRow.attempt, UsageIntervalRow.gpus, UsageIntervalRow.end_reason)
            .where(UsageIntervalRow.kind == "allocation", UsageIntervalRow.subject == allocation_id)
            .order_by(UsageIntervalRow.attempt)
        )
        found = [(attempt, gpus, reason) for attempt, gpus, reason in rows]
        assert await usage.drift(session) == []
    return found
