"""Bring a database to the newest schema with Alembic, from code (no alembic.ini needed at run time)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url)
    return config


def head() -> str:
    """The newest revision this code knows."""
    revision = ScriptDirectory.from_config(alembic_config("postgresql://")).get_current_head()
    assert revision is not None
    return revision


async def current(engine: AsyncEngine) -> str | None:
    """The database's revision; None when it has never been migrated."""
    async with engine.connect() as connection:
        return await connection.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Run pending migrations on `engine` (idempotent: an up-to-date database is left alone)."""

    def _upgrade(connection: object) -> None:
        config = alembic_config(str(engine.url))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    async with engine.begin() as connection:
        await connection.run_sync(_upgrade)
