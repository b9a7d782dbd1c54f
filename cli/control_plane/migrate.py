"""`berth migrate`: bring the database to the newest schema (what production runs before anything else), or with
`--wait`, wait until something else has (a Kubernetes init container, while the migration Job runs).

`--fleet FILE` then loads a first fleet into a database that holds none, with store/apply.py directly, for a control
plane whose API is not up yet, and gives each of its tenants a first token (printed once); a database that already
holds one is left as it is (`berth apply` changes it, through the API).

`--admin-token-to FILE` and `--node-tokens-to DIR --node N ...` then make the tokens needed before the API can be
called (cli/control_plane/bootstrap.py): the first admin token, and each node agent's. Every step is safe to run
again, alone or together: a file that already holds a token is kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from cli.control_plane.bootstrap import TokenPlan, make_tokens
from cli.output import console, errors, fail
from config.context import NotConfigured, database_url
from config.settings import Settings
from fleet.errors import FleetError
from fleet.fleet import Fleet
from fleet.loader import load_fleet
from store.apply import ApplyRefused, ApplyResult, apply_fleet, refuse_non_inventory
from store.db import create_engine, session_factory
from store.migrate import current, head, upgrade
from store.outage import UNREACHABLE_OR_REFUSED
from store.tokens import ensure_tenant_tokens


async def _migrate(url: str) -> None:
    engine = create_engine(url, pool_size=1)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


class _NotEmpty(Exception):
    """The database already holds a fleet: the first fleet's apply is rolled back."""


async def _first_fleet(url: str, fleet: Fleet) -> tuple[ApplyResult, dict[str, str]] | None:
    """Apply `fleet` to a database that holds none, and give each tenant a token in the same transaction (the
    tokens' plaintext, by tenant, with the result); None (and nothing written) when it already holds one: then the
    apply would have found something there (unchanged, updated, or kept though not in the file), not only created."""
    engine = create_engine(url, pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            result = await apply_fleet(session, fleet)
            if result.unchanged or any(change.action in ("updated", "kept", "deleted") for change in result.changes):
                raise _NotEmpty  # leaves the transaction: rolled back
            return result, await ensure_tenant_tokens(session)
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
            "the API is up, and print each tenant's first token once; one that holds a fleet is left as it is "
            "(`berth apply` changes it).",
        ),
    ] = None,
    admin_token_to: Annotated[
        str | None,
        typer.Option(
            "--admin-token-to",
            metavar="FILE",
            help="Then write a new admin token to FILE (mode 0600), the first one, with which `berth tokens` and "
            "`berth apply` go through the API; a FILE that already holds a token is kept and none is made. "
            "`-` prints it to stdout instead (a new one each time; the other messages go to stderr).",
        ),
    ] = None,
    node_tokens_to: Annotated[
        Path | None,
        typer.Option(
            "--node-tokens-to",
            metavar="DIR",
            help="Then write each --node's agent token to DIR/<node> (mode 0600); a file that already holds a "
            "token is kept and none is made for it.",
        ),
    ] = None,
    nodes: Annotated[
        list[str] | None,
        typer.Option("--node", help="With --node-tokens-to: a node of the fleet to write a token for (repeat)."),
    ] = None,
    dir_per_node: Annotated[
        bool,
        typer.Option(
            "--dir-per-node",
            help="With --node-tokens-to: write DIR/<node>/token instead, one directory per node, so that each agent "
            "can be given its own directory (a volume, a Secret) and no other node's token.",
        ),
    ] = False,
    label: Annotated[
        str | None,
        typer.Option("--label", help="A note on who holds the tokens made now (`berth tokens list` shows it)."),
    ] = None,
) -> None:
    """Run the database migrations (idempotent: an up-to-date database is left alone), then set up what the API
    needs before it can be called: a first fleet, the first admin token, the node agents' tokens."""
    plan = TokenPlan(admin_token_to, node_tokens_to, tuple(nodes or ()), dir_per_node, label)
    say = errors.print if admin_token_to == "-" else console.print  # stdout is the admin token's alone
    if wait is not None and (fleet_files or admin_token_to is not None or node_tokens_to is not None):
        fail("--wait migrates nothing and so loads no fleet and makes no token: give those options to the migration")
    if (node_tokens_to is None) != (not nodes):
        fail("--node-tokens-to DIR writes node tokens: give it with --node NAME (one or more)")
    if dir_per_node and node_tokens_to is None:
        fail("--dir-per-node goes with --node-tokens-to DIR")
    if label is not None and admin_token_to is None and node_tokens_to is None:
        fail("--label is a note on the tokens made: give it with --admin-token-to or --node-tokens-to")
    if problem := plan.problem():
        fail(problem)
    try:
        url = database_url(Settings())
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
    say("database schema is up to date")
    if fleet is not None:
        _load_first_fleet(url, fleet, say)
    if admin_token_to is None and node_tokens_to is None:
        return
    try:
        shown = make_tokens(url, plan, lambda line: say(line, highlight=False))
    except ValueError as exc:  # a node the fleet does not have
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {exc.filename or 'a token file'}: {exc.strerror}; no token was made for it")
    except UNREACHABLE_OR_REFUSED as exc:
        fail(f"cannot make the tokens: {exc}")
    if shown is not None:
        typer.echo(shown)


def _load_first_fleet(url: str, fleet: Fleet, say: Callable[..., None]) -> None:
    try:
        loaded = asyncio.run(_first_fleet(url, fleet))
    except ApplyRefused as exc:
        fail(str(exc))
    except UNREACHABLE_OR_REFUSED as exc:
        fail(f"cannot load the fleet: {exc}")
    if loaded is None:
        say("the database already holds a fleet: left as it is (`berth apply -f` changes it)")
        return
    result, tokens = loaded
    say(f"first fleet loaded: {result.summary()}", highlight=False)
    for tenant, token in sorted(tokens.items()):
        say(f"new API token for tenant {tenant} (shown once): {token}", highlight=False)
