"""`berth tokens create --tenant T | --admin | --node N`, `list`, `revoke`, `rotate`: API tokens, through the API
(`/v1/tokens`, the admin role), so that every token made or revoked is in the request log under who did it.

A node token is what a real node agent holds (in a file, `berth worker node --token-file`): it can report for its
own node and, through the node gateway, do its own node's work, nothing else. A revoked token is refused everywhere
within seconds; `rotate` replaces a node's token under a running agent, which rereads its file. The token is printed
(or written) once; the API keeps only its SHA-256 digest.

The very first admin token, and node tokens for a control plane whose API is not up yet, come from `berth migrate
--admin-token-to FILE` and `--node-tokens-to DIR` (cli/control_plane/migrate.py), which set up the database itself.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from berth import Client
from cli import values
from cli.client import ApiOption, TokenOption, api_client
from cli.output import Column, OutputFormat, OutputOption, console, fail, is_data, print_data, table
from config.context import write_private
from contracts.http import TokenCreated

app = typer.Typer(help="API bearer tokens (admin, through the API).", no_args_is_help=True, add_completion=False)


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
    api: ApiOption = None,
    token: TokenOption = None,
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
    if expires_in is not None and values.seconds(expires_in, "--expires-in", days=True) <= 0:
        fail(f"--expires-in {expires_in!r}: a token's lifetime is more than 0", reason="invalid_argument")
    if to_dir is not None or (nodes and len(nodes) > 1):
        if not nodes or to_dir is None:
            fail("--to-dir writes node tokens: give --node NAME (one or more) with --to-dir DIR")
        with api_client(api, token) as client:
            _write_node_tokens(client, nodes, to_dir, label, dir_per_node)
        return
    if dir_per_node:
        fail("--dir-per-node goes with --to-dir DIR")
    node = nodes[0] if nodes else None
    body = {"role": role, "tenant": tenant, "node": node, "label": label, "expires_in": expires_in}
    with api_client(api, token) as client:
        created = client.tokens.create({key: value for key, value in body.items() if value is not None})
    if is_data(output):
        print_data(created.model_dump(mode="json"), output)
        return
    console.print(
        f"Token for {_whose(created)}{_until(created.expires_at)} (shown once; store it now):", highlight=False
    )
    typer.echo(created.token)


def _whose(created: TokenCreated) -> str:
    if created.node:
        return f"node {created.node}"
    return f"a {created.role} of tenant {created.tenant}" if created.tenant else f"an {created.role}"


def _until(expires_at: datetime | None) -> str:
    return f", until {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""


@app.command("list")
def list_tokens(
    all_: Annotated[bool, typer.Option("--all", help="Revoked and expired tokens too.")] = False,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Every live token: its id, role, tenant or node, label, and when it was made, expires or was revoked. The
    plaintext is never shown again: only its digest is kept."""
    with api_client(api, token) as client:
        found = [view.model_dump(mode="json") for view in client.tokens.list(all=all_)]
    if is_data(output):
        print_data({"tokens": found}, output)
        return
    rows = table(Column("id", key=True), "role", "scope", "label", "created", "ends", box=None, highlight=False)
    for t in found:
        ends = f"revoked {t['revoked_at'][:16]}" if t["revoked_at"] else (t["expires_at"] or "never")[:16]
        scope = f"tenant {t['tenant']}" if t["tenant"] else f"node {t['node']}" if t["node"] else "every tenant"
        rows.add_row(str(t["id"]), str(t["role"]), scope, str(t["label"] or ""), str(t["created_at"])[:16], ends)
    rows.print()


def _write_node_tokens(client: Client, nodes: list[str], directory: Path, label: str | None, per_node: bool) -> None:
    """One token file per node agent, as a deployment hands them out: a file that already holds a token is kept."""
    directory.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        path = directory / node / "token" if per_node else directory / node
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_file() and path.read_text().strip():
            console.print(f"{path} already holds a token; kept", highlight=False)
            continue
        created = client.tokens.create({"node": node, **({"label": label} if label else {})})
        _write_or_revoke(client, path, created, "no token was left live")
        console.print(f"node token for {node} written to {path}", highlight=False)


def _write_or_revoke(client: Client, path: Path, created: TokenCreated, then: str) -> None:
    """Write a new token to `path` (0600 from its first byte, even over a leftover file); if it cannot be written,
    revoke it: never leave a live token that nobody holds."""
    try:
        write_private(path, created.token + "\n")
    except OSError as error:
        client.tokens.revoke(created.id)
        fail(f"cannot write {path}: {error.strerror}; the new token was revoked, {then}")


@app.command("revoke")
def revoke(
    node: Annotated[str | None, typer.Option("--node", help="Revoke every live token of this node.")] = None,
    token_id: Annotated[int | None, typer.Option("--id", help="Revoke one token by its id.")] = None,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Revoke tokens: every API process and node gateway refuses them within seconds."""
    if (node is None) == (token_id is None):
        fail("give --node NAME or --id ID")
    with api_client(api, token) as client:
        revoked = (client.tokens.revoke_node(node) if node is not None else client.tokens.revoke(token_id)).revoked
    if not revoked:
        fail(f"no live token of node {node}")
    console.print(
        f"revoked token(s) {', '.join(map(str, revoked))}; refused everywhere within seconds", highlight=False
    )


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
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Replace a node's token without restarting its agent: write a new token over its file (the agent rereads it
    every 2 s), wait `--grace`, then revoke the node's older tokens."""
    pause = values.seconds(grace, "--grace")
    path = to_dir / node / "token" if dir_per_node else to_dir / node
    if path.is_dir():
        fail(f"{path} is a directory: tokens written with `create --dir-per-node` are rotated with --dir-per-node")
    if not path.parent.is_dir():
        fail(f"{path.parent} does not exist: give the directory the agent's token file is in")
    with api_client(api, token) as client:
        fresh = client.tokens.create({"node": node, "label": "rotated"})
        _write_or_revoke(client, path, fresh, "the old one still works")
        console.print(f"new token for {node} written to {path}; older ones revoked in {grace}", highlight=False)
        time.sleep(pause)
        revoked = client.tokens.revoke_node(node, keep=fresh.id).revoked
    console.print(f"revoked the older token(s) of {node}: {', '.join(map(str, revoked)) or 'none'}", highlight=False)
