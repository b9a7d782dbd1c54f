"""Engine and session factory for the async PostgreSQL store."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine


def create_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    # No pre-ping: it costs a round trip per checkout; recycled connections cover servers that restart.
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=300)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(session: AsyncSession) -> None:
    """Ask PostgreSQL for the smallest answer (`SELECT 1`): raises whatever keeps it from answering."""
    await session.execute(text("SELECT 1"))
