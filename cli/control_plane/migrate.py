"""`berth migrate`: bring the database to the newest schema (what production runs before anything else), or with
`--wait`, wait until something else has (a Kubernetes init container, while the migration Job runs).

`--fleet FILE` then loads a first fleet into a database that holds none, with store/apply.py directly, for a control
plane whose API is not up yet; a database that already holds one is left as it is (`berth apply` changes it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import typer

from cli.output import console, fail
from config.context import NotConfigured, database_url
from config.settings import Settings
from fleet.errors import FleetError
from fleet.fleet import Fleet
from fleet.loader import load_fleet
from store.apply import ApplyRefused, ApplyResult, apply_fleet, refuse_non_inventory
from store.db import create_engine, session_factory
from store.migrate import current, head, upgrade
from store.outage import UNREACHABLE_OR_REFUSED


async def _migrate(url: str) -> None:
    engine = create_engine(url, pool_size=1)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


class _NotEmpty(Exception):
    """The database already holds a fleet: the first fleet's apply is rolled back."""


async def _first_fleet(url: str, fleet: Fleet) -> ApplyResult | None:
    """Apply `fleet` to a database that holds none; None (and nothing written) when it already holds one: then the
    apply would have found something there (unchanged, updated, or kept though not in the file), not only created."""
    engine = create_engine(url, pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            result = await apply_fleet(session, fleet)
            if result.unchanged or any(change.action in ("updated", "kept", "deleted") for change in result.changes):
                raise _NotEmpty  # leaves the transaction: rolled back
            return result
    except _NotEmpty:
        return None
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
    fleet_files: Annotated[
        list[Path] | None,
        typer.Option(
            "--fleet",
            help="Then load this fleet file (repeat for several) into a database that holds no fleet yet, before "
            "the API is up; one that holds a fleet is left as it is (`berth apply` changes it).",
        ),
    ] = None,
) -> None:
    """Run the database migrations (idempotent: an up-to-date database is left alone)."""
    try:
        url = database_url(Settings())
        if wait is not None and fleet_files:
            fail("--wait migrates nothing and so loads no fleet: give --fleet to the migration itself")
        fleet = load_fleet(fleet_files) if fleet_files else None  # a bad file fails before anything is written
        if fleet is not None:
            refuse_non_inventory(fleet)
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
    except (NotConfigured, FleetError, ApplyRefused) as exc:
        fail(str(exc))
    except UNREACHABLE_OR_REFUSED as exc:
        fail(f"cannot migrate the database: {exc}")
    console.print("database schema is up to date")
    if fleet is None:
        return
    try:
        result = asyncio.run(_first_fleet(url, fleet))
    except ApplyRefused as exc:
        fail(str(exc))
    except UNREACHABLE_OR_REFUSED as exc:
        fail(f"cannot load the fleet: {exc}")
    if result is None:
        console.print("the database already holds a fleet: left as it is (`berth apply -f` changes it)")
    else:
        console.print(f"first fleet loaded: {result.summary()}", highlight=False)
