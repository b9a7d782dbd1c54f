"""Engine and session factory for the async PostgreSQL store, and the session types everyone else names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, String, any_, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

# The session types the rest of Berth annotates with (`AsyncSession`, `async_sessionmaker[AsyncSession]`): it imports
# them from here, so no module outside store/ imports SQLAlchemy itself.
__all__ = ["AsyncEngine", "AsyncSession", "among", "async_sessionmaker", "create_engine", "ping", "session_factory"]


def create_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    # No pre-ping: it costs a round trip per checkout; recycled connections cover servers that restart.
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=300)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(session: AsyncSession) -> None:
    """Ask PostgreSQL for the smallest answer (`SELECT 1`): raises whatever keeps it from answering."""
    await session.execute(text("SELECT 1"))


def among(column: ColumnElement[Any], values: Iterable[Any]) -> ColumnElement[bool]:
    """`column = ANY(:values)`, the values bound as one array: where `IN` binds a parameter per value, and a
    statement may carry at most 32,767 (PostgreSQL's protocol), a fleet's node names or slot ids need not fit."""
    element = String() if isinstance(column.type, String) else column.type  # no length: a cast would truncate
    return column == any_(bindparam(None, list(values), type_=ARRAY(element)))
