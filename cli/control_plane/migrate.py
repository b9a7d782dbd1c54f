"""`berth migrate`: bring the database to the newest schema (what production runs before anything else), or with
`--wait`, wait until something else has (a Kubernetes init container, while the migration Job runs)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from cli.output import console, fail
from config.context import NotConfigured, database_url
from config.settings import Settings
from store.db import create_engine
from store.migrate import current, head, upgrade
from store.outage import UNREACHABLE_OR_REFUSED


async def _migrate(url: str) -> None:
    engine = create_engine(url, pool_size=1)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


async def _wait(url: str, seconds: float) -> str | None:
    """The database's revision once it is this code's head, or the last one seen when `seconds` ran out."""
    engine = create_engine(url, pool_size=1)
    wanted, seen, deadline = head(), None, time.monotonic() + seconds
    try:
        while True:
            try:
                seen = await current(engine)
            except UNREACHABLE_OR_REFUSED:
                seen = None  # not reachable yet (the database starting, a network policy being applied)
            if seen == wanted or time.monotonic() >= deadline:
                return seen
            await asyncio.sleep(2)
    finally:
        await engine.dispose()


def migrate(
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            help="Migrate nothing: wait up to this many seconds for the schema to be "
            "this version's (an init container, while the migration Job runs), then exit 0, or 1.",
        ),
    ] = None,
) -> None:
    """Run the database migrations (idempotent: an up-to-date database is left alone)."""
    try:
        url = database_url(Settings())
        if wait is not None:
            seen = asyncio.run(_wait(url, wait))
            if seen != head():
                fail(
                    f"the database schema is at {seen or 'nothing'}, not {head()}, after {wait:g} s: has "
                    "`berth migrate` (the migration Job) run?"
                )
            console.print(f"database schema is at {head()}")
            return
        asyncio.run(_migrate(url))
    except NotConfigured as exc:
        fail(str(exc))
    except UNREACHABLE_OR_REFUSED as exc:
        fail(f"cannot migrate the database: {exc}")
    console.print("database schema is up to date")
