"""`berth migrate`: bring the database to the newest schema (what production runs before anything else)."""

from __future__ import annotations

import asyncio

from sqlalchemy.exc import DBAPIError, OperationalError

from cli.output import console, fail
from config.context import NotConfigured, database_url
from config.settings import Settings
from store.db import create_engine
from store.migrate import upgrade


async def _migrate(url: str) -> None:
    engine = create_engine(url, pool_size=1)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def migrate() -> None:
    """Run the database migrations (idempotent: an up-to-date database is left alone)."""
    try:
        asyncio.run(_migrate(database_url(Settings())))
    except NotConfigured as exc:
        fail(str(exc))
    except (OSError, OperationalError, DBAPIError) as exc:
        fail(f"cannot migrate the database: {exc}")
    console.print("database schema is up to date")
