"""The tokens a control plane needs before anyone can call its API, made by `berth migrate` straight in the database:
the first admin token (`--admin-token-to`), and the node agents' tokens (`--node-tokens-to DIR --node N ...`).

Everything else about tokens goes through the API under an admin token (`berth tokens`), which is why the first one
cannot: this is the control-plane side that sets the database up, as `--fleet` loads the first fleet. Each step is
safe to run again: a file that already holds a token is kept and no token is made for it. A token is written (mode
0600 from its first byte) before its transaction commits, so a file that cannot be written leaves no live token that
nobody holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from config.context import write_private
from store.db import create_engine, session_factory
from store.tokens import Role, create_token

ADMIN_LABEL = "berth migrate --admin-token-to"


@dataclass(frozen=True)
class TokenPlan:
    """What to make: the admin token's file (`-`: stdout), and node tokens' directory and nodes."""

    admin_to: str | None = None
    node_dir: Path | None = None
    nodes: tuple[str, ...] = ()
    per_node: bool = False
    label: str | None = None

    def node_path(self, node: str) -> Path:
        assert self.node_dir is not None
        return self.node_dir / node / "token" if self.per_node else self.node_dir / node

    def problem(self) -> str | None:
        """Why a file of this plan could not be written, found before anything is migrated or made."""
        if self.admin_to is not None and self.admin_to != "-" and Path(self.admin_to).is_dir():
            return f"--admin-token-to {self.admin_to} is a directory: give the file to write"
        for node in self.nodes:
            if (path := self.node_path(node)).is_dir():
                return f"{path} is a directory: tokens written with --dir-per-node are DIR/<node>/token"
        return None


def holds_token(path: Path) -> bool:
    return path.is_file() and bool(path.read_text().strip())


async def _issue(url: str, role: Role, label: str | None, node: str | None, path: Path | None) -> str:
    """A new token of `role` (for `node`), written to `path` when given, committed only once it is there."""
    engine = create_engine(url, pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            token = await create_token(session, role, label=label, node=node)
            if path is not None:
                write_private(path, token + "\n")
        return token
    finally:
        await engine.dispose()


def _written(url: str, role: Role, label: str | None, node: str | None, path: Path) -> None:
    """`_issue` to a file that holds no token yet: one that holds one afterwards though the commit failed is
    removed, since that token works nowhere (and a re-run would keep it)."""
    try:
        asyncio.run(_issue(url, role, label, node, path))
    except BaseException:
        if holds_token(path):
            path.unlink()
        raise


def make_tokens(url: str, plan: TokenPlan, say: Callable[[str], None]) -> str | None:
    """Make what `plan` asks for and is not there yet; the admin token's plaintext when it goes to stdout.

    Raises ValueError (`UnknownScope`) for a node the fleet does not have, OSError for a file that cannot be written,
    and the database's errors; tokens made before that stay made, and their files written."""
    if plan.admin_to is not None and plan.admin_to != "-":
        path = Path(plan.admin_to)
        if holds_token(path):
            say(f"{path} already holds a token; kept")
        else:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _written(url, "admin", plan.label or ADMIN_LABEL, None, path)
            say(f"admin token written to {path}")
    if plan.node_dir is not None:
        plan.node_dir.mkdir(parents=True, exist_ok=True)
    for node in plan.nodes:
        path = plan.node_path(node)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if holds_token(path):
            say(f"{path} already holds a token; kept")
            continue
        _written(url, "node", plan.label, node, path)
        say(f"node token for {node} written to {path}")
    if plan.admin_to == "-":  # last: a step after it that failed would leave it made but never shown
        return asyncio.run(_issue(url, "admin", plan.label or ADMIN_LABEL, None, None))
    return None
