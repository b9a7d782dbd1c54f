"""The tokens a `berth up` session hands out: admin and tenant tokens for the person (in context.json), and one node
token per simulated agent, written to `<state>/tokens/<node>` (mode 0600) where only the agents' process reads them:
a token on a command line would be readable by every user through /proc."""

from __future__ import annotations

from pathlib import Path

from config.context import write_private
from gateway.seal import ensure_key_file
from store.db import create_engine, session_factory
from store.tokens import DEV_STACK_LABEL, create_token, rotate_dev_stack_tokens


async def issue_tokens(url: str, nodes: list[str]) -> tuple[str, dict[str, str], dict[str, str]]:
    """Admin and tenant tokens for the user and a node token per agent; the previous session's are revoked."""
    engine = create_engine(url, pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            admin, tenants = await rotate_dev_stack_tokens(session)
            node_tokens = {
                node: await create_token(session, "node", node=node, label=DEV_STACK_LABEL) for node in nodes
            }
            return admin, tenants, node_tokens
    finally:
        await engine.dispose()


def write_token_files(directory: Path, tokens: dict[str, str]) -> Path:
    """One file per node, readable by its owner only, written whole or not at all."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    for node, token in tokens.items():
        write_private(directory / node, token + "\n")
    return directory


def gateway_key(state: Path) -> Path:
    """The node gateway's sealing key, made once per state directory: a gateway restarted by the supervisor keeps
    accepting the answers to tasks it handed out before it died."""
    path = state / "gateway.key"
    ensure_key_file(path)
    return path
