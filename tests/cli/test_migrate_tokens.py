"""`berth migrate --admin-token-to FILE` and `--node-tokens-to DIR --node N`: the tokens a control plane needs before
anyone can call its API (`berth tokens` and `berth apply` go through it under an admin token), made straight in the
database by the command that sets the database up. Each is written readable by its owner only, a re-run keeps the
files that hold a token, and the tokens written are live ones of the right role and scope."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from fleet.loader import load_fleet
from store.db import create_engine, session_factory
from store.tokens import Principal, listed, verify

runner = CliRunner()
EXAMPLE_FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"


def _principal(url: str, token: str) -> Principal | None:
    async def look() -> Principal | None:
        engine = create_engine(url, pool_size=1)
        try:
            async with session_factory(engine)() as session:
                return await verify(session, token)
        finally:
            await engine.dispose()

    return asyncio.run(look())


def _live_tokens(url: str) -> list[tuple[str, str | None, str | None]]:
    """(role, node, label) of every live token."""

    async def look() -> list[tuple[str, str | None, str | None]]:
        engine = create_engine(url, pool_size=1)
        try:
            async with session_factory(engine)() as session:
                return [(row.role, row.node, row.label) for row in await listed(session)]
        finally:
            await engine.dispose()

    return asyncio.run(look())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_control_plane_gets_its_fleet_tenant_tokens_and_first_admin_token_in_one_step(
    empty_database_url: str, tmp_path: Path
) -> None:
    env = {"BERTH_DATABASE_URL": empty_database_url}
    admin_file = tmp_path / "secrets" / "admin-token"
    first = runner.invoke(app, ["migrate", "--fleet", str(EXAMPLE_FLEET), "--admin-token-to", str(admin_file)], env=env)
    assert first.exit_code == 0, first.output
    lines = first.output.strip().splitlines()
    assert lines[0] == "database schema is up to date" and lines[1].startswith("first fleet loaded: "), lines
    tenants = sorted(load_fleet([EXAMPLE_FLEET]).tenants)
    prefixes = [f"new API token for tenant {tenant} (shown once): " for tenant in tenants]
    assert [line.split(": ")[0] + ": " for line in lines[2:-1]] == prefixes, lines
    for prefix, line in zip(prefixes, lines[2:-1], strict=True):
        member = _principal(empty_database_url, line.removeprefix(prefix))
        assert member is not None and member.role == "member" and list(member.tenants) == [line.split()[5]]
    assert lines[-1] == f"admin token written to {admin_file}"

    token = admin_file.read_text()
    assert token.endswith("\n") and _mode(admin_file) == 0o600 and _mode(admin_file.parent) == 0o700
    admin = _principal(empty_database_url, token.strip())
    assert admin is not None and admin.role == "admin" and admin.actor.endswith("(berth migrate --admin-token-to)")

    again = runner.invoke(app, ["migrate", "--fleet", str(EXAMPLE_FLEET), "--admin-token-to", str(admin_file)], env=env)
    assert again.exit_code == 0, again.output
    assert again.output.strip().splitlines() == [
        "database schema is up to date",
        "the database already holds a fleet: left as it is (`berth apply -f` changes it)",
        f"{admin_file} already holds a token; kept",
    ]
    assert admin_file.read_text() == token and _mode(admin_file) == 0o600
    live = _live_tokens(empty_database_url)
    assert [role for role, _, _ in live].count("admin") == 1 and len(live) == len(tenants) + 1, live


def test_an_admin_token_to_stdout_is_stdout_s_only_line_and_a_new_one_each_time(database_url: str) -> None:
    env = {"BERTH_DATABASE_URL": database_url}
    tokens = []
    for _ in range(2):
        done = runner.invoke(app, ["migrate", "--admin-token-to", "-", "--label", "operators"], env=env)
        assert done.exit_code == 0, done.output
        assert done.stderr.strip() == "database schema is up to date"
        [token] = done.stdout.splitlines()
        admin = _principal(database_url, token)
        assert admin is not None and admin.role == "admin" and admin.actor.endswith("(operators)")
        tokens.append(token)
    assert tokens[0] != tokens[1]


def test_a_leftover_empty_file_is_replaced_by_a_private_one(database_url: str, tmp_path: Path) -> None:
    leftover = tmp_path / "admin-token"
    leftover.write_text("\n")
    leftover.chmod(0o644)
    done = runner.invoke(app, ["migrate", "--admin-token-to", str(leftover)], env={"BERTH_DATABASE_URL": database_url})
    assert done.exit_code == 0, done.output
    assert _mode(leftover) == 0o600 and _principal(database_url, leftover.read_text().strip()) is not None


def test_each_node_agent_gets_its_own_token_file_and_a_re_run_keeps_them(
    empty_database_url: str, tmp_path: Path
) -> None:
    env = {"BERTH_DATABASE_URL": empty_database_url}
    tokens = tmp_path / "tokens"
    nodes = ["j22u05", "use1-h200-01"]
    node_options = [option for node in nodes for option in ("--node", node)]
    per_node = ["--node-tokens-to", str(tokens), "--dir-per-node", *node_options, "--label", "compose"]
    first = runner.invoke(app, ["migrate", "--fleet", str(EXAMPLE_FLEET), *per_node], env=env)
    assert first.exit_code == 0, first.output
    assert first.output.strip().splitlines()[-2:] == [
        f"node token for {node} written to {tokens / node / 'token'}" for node in nodes
    ]
    written = {}
    for node in nodes:
        path = tokens / node / "token"
        assert _mode(path) == 0o600 and _mode(path.parent) == 0o700, node
        agent = _principal(empty_database_url, path.read_text().strip())
        assert agent is not None and (agent.role, agent.node) == ("node", node)
        assert agent.actor.endswith("(compose)")
        written[node] = path.read_text()

    (tokens / nodes[1] / "token").unlink()  # a volume lost: only that node gets a new token
    again = runner.invoke(app, ["migrate", *per_node], env=env)  # alone, without --fleet
    assert again.exit_code == 0, again.output
    assert again.output.strip().splitlines() == [
        "database schema is up to date",
        f"{tokens / nodes[0] / 'token'} already holds a token; kept",
        f"node token for {nodes[1]} written to {tokens / nodes[1] / 'token'}",
    ]
    assert (tokens / nodes[0] / "token").read_text() == written[nodes[0]]
    assert (tokens / nodes[1] / "token").read_text() != written[nodes[1]]
    assert sorted(node for role, node, _ in _live_tokens(empty_database_url) if role == "node") == [
        nodes[0],
        nodes[1],
        nodes[1],  # the lost file's token is not revoked here: `berth tokens revoke --id` does that
    ]

    flat = runner.invoke(app, ["migrate", "--node-tokens-to", str(tmp_path / "flat"), "--node", nodes[0]], env=env)
    assert flat.exit_code == 0, flat.output
    assert _mode(tmp_path / "flat" / nodes[0]) == 0o600
    agent = _principal(empty_database_url, (tmp_path / "flat" / nodes[0]).read_text().strip())
    assert agent is not None and agent.node == nodes[0]


def test_a_node_the_fleet_does_not_have_gets_no_token_and_no_file(database_url: str, tmp_path: Path) -> None:
    env = {"BERTH_DATABASE_URL": database_url}
    done = runner.invoke(app, ["migrate", "--node-tokens-to", str(tmp_path), "--node", "nowhere-01"], env=env)
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert done.stderr.strip() == "error: unknown node 'nowhere-01': apply a fleet file that declares it first"
    assert not (tmp_path / "nowhere-01").exists() and _live_tokens(database_url) == []


def test_options_that_do_not_go_together_fail_before_anything_is_done(empty_database_url: str, tmp_path: Path) -> None:
    env = {"BERTH_DATABASE_URL": empty_database_url}
    (tmp_path / "j22u05").mkdir()
    for arguments, message in [
        (["--node", "j22u05"], "--node-tokens-to DIR writes node tokens: give it with --node NAME (one or more)"),
        (["--node-tokens-to", str(tmp_path)], "--node-tokens-to DIR writes node tokens: give it with --node NAME"),
        (["--dir-per-node"], "--dir-per-node goes with --node-tokens-to DIR"),
        (["--label", "x"], "--label is a note on the tokens made: give it with --admin-token-to or --node-tokens-to"),
        (["--wait", "0", "--admin-token-to", "-"], "--wait migrates nothing and so loads no fleet and makes no token"),
        (["--admin-token-to", str(tmp_path)], f"--admin-token-to {tmp_path} is a directory: give the file to write"),
        (
            ["--node-tokens-to", str(tmp_path), "--node", "j22u05"],
            f"{tmp_path / 'j22u05'} is a directory: tokens written with --dir-per-node are DIR/<node>/token",
        ),
    ]:
        done = runner.invoke(app, ["migrate", *arguments], env=env)
        assert done.exit_code == 1 and done.stdout == "", (arguments, done.output)
        assert done.stderr.startswith(f"error: {message}"), (arguments, done.stderr)
    waited = runner.invoke(app, ["migrate", "--wait", "0"], env=env)  # none of them migrated
    assert waited.exit_code == 1 and "at nothing" in waited.output, waited.output
