"""`berth tokens create --tenant T | --admin | --node N`, `revoke`, `rotate`: API tokens, straight in the database.

A node token is what a real node agent holds (in a file, `berth worker node --token-file`): it can report for its
own node and, through the node gateway, do its own node's work, nothing else. A revoked token is refused everywhere
within seconds; `rotate` replaces a node's token under a running agent, which rereads its file.

This is how an operator bootstraps access, so it cannot go through the API it grants access to: like
`berth apply`, it uses the database named by BERTH_DATABASE_URL or `berth up`'s context. The token is printed
once; only its SHA-256 digest is stored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from cli import values
from cli.output import Column, OutputFormat, OutputOption, console, fail, is_data, print_data, table
from config.context import NotConfigured, database_url, write_private
from config.settings import Settings
from store.db import AsyncSession, create_engine, session_factory
from store.outage import UNREACHABLE_OR_REFUSED
from store.tokens import Role, create_token, listed, revoke_tokens, verify

T = TypeVar("T")

app = typer.Typer(
    help="API bearer tokens (writes to the database directly).", no_args_is_help=True, add_completion=False
)


def _in_database(url: str, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """Run `work` in one transaction on the database at `url` (each command is one short connection)."""

    async def run() -> T:
        engine = create_engine(url, pool_size=1)
        try:
            async with session_factory(engine).begin() as session:
                return await work(session)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _create(
    url: str, role: Role, tenant: str | None, label: str | None, node: str | None, expires_at: datetime | None = None
) -> str:
    return _in_database(
        url, lambda session: create_token(session, role, tenant, label, node=node, expires_at=expires_at)
    )


def _revoke(url: str, node: str | None = None, token_id: int | None = None, keep: int | None = None) -> list[int]:
    return _in_database(url, lambda session: revoke_tokens(session, node=node, token_id=token_id, keep=keep))


@app.command("create")
def create(
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="A service account of this tenant (a member unless --role).")
    ] = None,
    admin: Annotated[bool, typer.Option("--admin", help="A token that acts on everything (--role admin).")] = False,
    role: Annotated[
        str | None,
        typer.Option(
            "--role",
            help="viewer or member (with --tenant), operator or admin (no tenant: they hold every tenant).",
        ),
    ] = None,
    expires_in: Annotated[
        str | None,
        typer.Option("--expires-in", help="The token stops working after this long, e.g. 90d, 12h (default: never)."),
    ] = None,
    nodes: Annotated[
        list[str] | None,
        typer.Option("--node", help="A node agent's token: reports for this node only (repeat with --to-dir)."),
    ] = None,
    label: Annotated[str | None, typer.Option("--label", help="A note on who holds it.")] = None,
    to_dir: Annotated[
        Path | None,
        typer.Option(
            "--to-dir",
            help="Node tokens: write each to DIR/<node> (mode 0600) instead of printing it; a "
            "file that already holds a token is kept and no token is created for it (safe to re-run).",
        ),
    ] = None,
    dir_per_node: Annotated[
        bool,
        typer.Option(
            "--dir-per-node",
            help="With --to-dir: write DIR/<node>/token instead, one directory per node, so that each agent can be "
            "given its own directory (a volume, a Secret) and no other node's token.",
        ),
    ] = False,
    output: OutputOption = OutputFormat.TEXT,
) -> None:
    """Create a service account's token (a role, a tenant for viewer and member, an expiry) or a node agent's, and
    print it (the only time it is shown). People do not need tokens: they log in (`berth login`)."""
    if admin:
        if role not in (None, "admin"):
            fail("--admin is --role admin; give one of them")
        role = "admin"
    if role is not None and role not in ("viewer", "member", "operator", "admin"):
        fail(f"--role {role}: use viewer, member, operator or admin")
    if sum((role in ("operator", "admin"), tenant is not None, bool(nodes))) != 1:
        fail("give exactly one of --tenant NAME (viewer or member), --role operator|admin, or --node NAME")
    expires_at = None
    if expires_in is not None:
        lifetime = values.seconds(expires_in, "--expires-in", days=True)
        if lifetime <= 0:
            fail(f"--expires-in {expires_in!r}: a token's lifetime is more than 0", reason="invalid_argument")
        expires_at = datetime.now(UTC) + timedelta(seconds=lifetime)
    if to_dir is not None or (nodes and len(nodes) > 1):
        if not nodes or to_dir is None:
            fail("--to-dir writes node tokens: give --node NAME (one or more) with --to-dir DIR")
        _write_node_tokens(nodes, to_dir, label, dir_per_node)
        return
    if dir_per_node:
        fail("--dir-per-node goes with --to-dir DIR")
    node = nodes[0] if nodes else None
    chosen: Role = "node" if node is not None else role or "member"  # type: ignore[assignment]
    try:
        token = _create(database_url(Settings()), chosen, tenant, label, node, expires_at)
    except NotConfigured as error:
        fail(str(error))
    except ValueError as error:  # an unknown tenant or node
        fail(str(error))
    except UNREACHABLE_OR_REFUSED as error:
        fail(f"cannot reach the database: {error}")
    if is_data(output):
        print_data(
            {
                "role": chosen,
                "tenant": tenant,
                "node": node,
                "token": token,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
            output,
        )
        return
    whose = f"node {node}" if node else f"a {chosen} of tenant {tenant}" if tenant else f"an {chosen}"
    until = f", until {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
    console.print(f"Token for {whose}{until} (shown once; store it now):", highlight=False)
    typer.echo(token)


@app.command("list")
def list_tokens(
    all_: Annotated[bool, typer.Option("--all", help="Revoked and expired tokens too.")] = False,
    output: OutputOption = OutputFormat.TEXT,
) -> None:
    """Every live token: its id, role, tenant or node, label, and when it was made, expires or was revoked. The
    plaintext is never shown again: only its digest is kept."""
    try:
        rows = _in_database(database_url(Settings()), lambda session: listed(session, include_ended=all_))
    except NotConfigured as error:
        fail(str(error))
    except UNREACHABLE_OR_REFUSED as error:
        fail(f"cannot reach the database: {error}")
    found = [
        {
            "id": r.id,
            "role": r.role,
            "tenant": r.tenant,
            "node": r.node,
            "label": r.label,
            "created_at": r.created_at.isoformat(),
            "expires_at": r.expires_at.isoformat() if r.expires_at else None,
            "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
        }
        for r in rows
    ]
    if is_data(output):
        print_data({"tokens": found}, output)
        return
    rows = table(Column("id", key=True), "role", "scope", "label", "created", "ends", box=None, highlight=False)
    for t in found:
        ends = f"revoked {t['revoked_at'][:16]}" if t["revoked_at"] else (t["expires_at"] or "never")[:16]
        scope = f"tenant {t['tenant']}" if t["tenant"] else f"node {t['node']}" if t["node"] else "every tenant"
        rows.add_row(str(t["id"]), str(t["role"]), scope, str(t["label"] or ""), str(t["created_at"])[:16], ends)
    rows.print()


def _write_node_tokens(nodes: list[str], directory: Path, label: str | None, per_node: bool = False) -> None:
    """One token file per node agent, as a deployment hands them out (docker-compose.yml's berth-node-tokens)."""
    url = database_url(Settings())
    directory.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        path = directory / node / "token" if per_node else directory / node
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_file() and path.read_text().strip():
            console.print(f"{path} already holds a token; kept", highlight=False)
            continue
        try:
            token = _create(url, "node", None, label, node)
        except ValueError as error:
            fail(str(error))
        except UNREACHABLE_OR_REFUSED as error:
            fail(f"cannot reach the database: {error}")
        write_private(path, token + "\n")  # 0600 from its first byte, even over a leftover file
        console.print(f"node token for {node} written to {path}", highlight=False)


@app.command("revoke")
def revoke(
    node: Annotated[str | None, typer.Option("--node", help="Revoke every live token of this node.")] = None,
    token_id: Annotated[int | None, typer.Option("--id", help="Revoke one token by its id.")] = None,
) -> None:
    """Revoke tokens: every API process and node gateway refuses them within seconds (store/token_cache.py)."""
    if (node is None) == (token_id is None):
        fail("give --node NAME or --id ID")
    try:
        revoked = _revoke(database_url(Settings()), node, token_id)
    except NotConfigured as error:
        fail(str(error))
    except UNREACHABLE_OR_REFUSED as error:
        fail(f"cannot reach the database: {error}")
    if not revoked:
        fail(f"no live token {'of node ' + node if node else f'with id {token_id}'}")
    console.print(
        f"revoked token(s) {', '.join(map(str, revoked))}; refused everywhere within seconds", highlight=False
    )


async def _new_node_token(session: AsyncSession, node: str) -> tuple[str, int]:
    """A new token of `node` (plaintext, id): the id is what a rotation keeps when it revokes the others."""
    token = await create_token(session, "node", label="rotated", node=node)
    found = await verify(session, token)
    assert found is not None
    return token, found.token_id


@app.command("rotate")
def rotate(
    node: Annotated[str, typer.Option("--node", help="The node whose token is replaced.")],
    to_dir: Annotated[Path, typer.Option("--to-dir", help="The directory holding DIR/<node>, which the agent reads.")],
    dir_per_node: Annotated[
        bool,
        typer.Option("--dir-per-node", help="The token is DIR/<node>/token (as `create --dir-per-node` wrote it)."),
    ] = False,
    grace: Annotated[
        str,
        typer.Option("--grace", help="How long the old token keeps working while the agent rereads (10s; 0: none)."),
    ] = "10s",
) -> None:
    """Replace a node's token without restarting its agent: write a new token over its file (the agent rereads it
    every 2 s), wait `--grace`, then revoke the node's older tokens."""
    pause = values.seconds(grace, "--grace")
    path = to_dir / node / "token" if dir_per_node else to_dir / node
    if path.is_dir():
        fail(f"{path} is a directory: tokens written with `create --dir-per-node` are rotated with --dir-per-node")
    if not path.parent.is_dir():
        fail(f"{path.parent} does not exist: give the directory the agent's token file is in")
    url = database_url(Settings())
    try:
        fresh, keep = _in_database(url, lambda session: _new_node_token(session, node))
    except NotConfigured as error:
        fail(str(error))
    except ValueError as error:
        fail(str(error))
    except UNREACHABLE_OR_REFUSED as error:
        fail(f"cannot reach the database: {error}")
    try:
        write_private(path, fresh + "\n")
    except OSError as error:
        _revoke(url, token_id=keep)  # never leave a live token that nobody holds
        fail(f"cannot write {path}: {error.strerror}; the new token was revoked, the old one still works")
    console.print(f"new token for {node} written to {path}; older ones revoked in {grace}", highlight=False)
    time.sleep(pause)
    try:
        revoked = _revoke(url, node=node, keep=keep)
    except UNREACHABLE_OR_REFUSED as error:
        fail(f"cannot reach the database to revoke the older tokens ({error}): `berth tokens revoke --id ID` them")
    console.print(f"revoked the older token(s) of {node}: {', '.join(map(str, revoked)) or 'none'}", highlight=False)
