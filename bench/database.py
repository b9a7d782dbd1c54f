"""A PostgreSQL of the benchmark's own: embedded, on loopback, migrated to the current schema, gone when it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from devstack.postgres import EmbeddedPostgres
from store.db import create_engine, session_factory
from store.migrate import upgrade


@dataclass(frozen=True)
class Database:
    server: EmbeddedPostgres
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]


@asynccontextmanager
async def embedded_database(data_dir: Path, *, pool_size: int = 10, durable: bool = False) -> AsyncIterator[Database]:
    """A server with its data in `data_dir`, migrated, and an engine of `pool_size` connections to it. `durable`:
    the WAL flushed at every commit, as production runs it; without, fsync is off, which is what a benchmark of
    anything but the commit itself wants."""
    server = EmbeddedPostgres(data_dir, durable=durable).start()
    engine = create_engine(server.url, pool_size=pool_size)
    try:
        await upgrade(engine)
        yield Database(server, engine, session_factory(engine))
    finally:
        await engine.dispose()
        server.stop()
