"""The dev stack's secrets as another user of the machine would meet them: `context.json` (admin and tenant tokens,
the database password) is never readable by anyone but its owner, not even for a moment while it is written, and the
dev stack's PostgreSQL refuses a loopback connection that does not give the generated password.

The whole `berth up` is tested in test_up.py (its database URL carries the password) and test_supervised_stack.py
(PostgreSQL killed with -9 comes back and the API, which holds that URL, answers again); here the server alone, as
`DevStack` configures it, so each rule is checked in a couple of seconds.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from config.context import StackContext, read_context, write_context
from config.settings import Settings
from devstack.postgres import EmbeddedPostgres
from devstack.tokens import write_token_files

CONTEXT = StackContext(
    temporal_address="127.0.0.1:7233",
    database_url="postgresql+asyncpg://postgres:secret@127.0.0.1:5432/berth",
    admin_token="brt_admin",
    tenant_tokens={"acme": "brt_acme"},
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def modes_while_written(tmp_path: Path) -> Iterator[list[tuple[str, str, int]]]:
    """(event, path, mode) of every file under `tmp_path`, taken at each audited operation (the opens, chmods and
    renames of the write): a file that is created wider and narrowed later shows its wide mode at the chmod's event,
    which fires before the chmod. Audit hooks cannot be removed, so this one goes quiet when the test ends."""
    seen: list[tuple[str, str, int]] = []
    listening = [True]

    def hook(event: str, _args: tuple[object, ...]) -> None:
        if not listening[0] or not event.startswith(("open", "os.")):
            return
        listening[0] = False  # our own stat calls below are audited too
        try:
            for path in tmp_path.rglob("*"):
                if path.is_file():
                    seen.append((event, path.name, _mode(path)))
        finally:
            listening[0] = True

    sys.addaudithook(hook)
    previous = os.umask(0o022)  # the usual umask: a file opened without a mode would be 0644
    try:
        yield seen
    finally:
        os.umask(previous)
        listening[0] = False


def test_the_context_file_is_created_readable_by_its_owner_only(
    tmp_path: Path, modes_while_written: list[tuple[str, str, int]]
) -> None:
    settings = Settings(state_dir=tmp_path / "state")

    write_context(settings, CONTEXT)

    assert _mode(settings.context_file) == 0o600
    assert read_context(settings) == CONTEXT
    assert modes_while_written, "the write was never observed"
    assert {mode for _event, _name, mode in modes_while_written} == {0o600}, modes_while_written


def test_a_partial_file_left_by_a_crash_does_not_lend_its_mode(tmp_path: Path) -> None:
    """A partial file a crash left (any mode) is not reused: opened again with O_TRUNC it would keep its 0644."""
    settings = Settings(state_dir=tmp_path / "state")
    tokens = tmp_path / "state" / "tokens"
    for leftover in (settings.state_dir / ".context.json.partial", tokens / ".host-a.partial"):
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_text("left by a crash")
        leftover.chmod(0o644)

    write_context(settings, CONTEXT)
    write_token_files(tokens, {"host-a": "brt_node"})

    assert (_mode(settings.context_file), _mode(tokens / "host-a")) == (0o600, 0o600)
    assert (tokens / "host-a").read_text() == "brt_node\n"
    assert sorted(p.name for p in settings.state_dir.rglob("*partial*")) == []


@pytest.fixture
def dev_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """The dev stack's server as `DevStack` makes it: its password kept beside the data directory."""
    server = EmbeddedPostgres(tmp_path / "postgres", durable=False, password_file=tmp_path / "postgres.password")
    server.start()
    try:
        yield server
    finally:
        server.destroy()


async def _connect(server: EmbeddedPostgres, password: str | None) -> int:
    connection = await asyncpg.connect(
        host="127.0.0.1", port=server.port, user="postgres", password=password, database="berth"
    )
    try:
        return int(await connection.fetchval("SELECT 1"))
    finally:
        await connection.close()


async def _refused(server: EmbeddedPostgres, password: str | None) -> str:
    with pytest.raises(asyncpg.InvalidPasswordError) as refused:
        await _connect(server, password)
    return str(refused.value)


async def test_the_dev_database_refuses_a_connection_without_its_password(
    dev_postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    password = (tmp_path / "postgres.password").read_text().strip()
    assert len(password) >= 32 and _mode(tmp_path / "postgres.password") == 0o600
    assert make_url(dev_postgres.url).password == password

    assert await _refused(dev_postgres, None) == 'password authentication failed for user "postgres"'
    assert await _refused(dev_postgres, "postgres") == 'password authentication failed for user "postgres"'
    assert await _connect(dev_postgres, password) == 1


async def test_a_restart_of_the_same_state_directory_keeps_the_password(
    dev_postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    password = dev_postgres.password
    dev_postgres.stop()
    again = EmbeddedPostgres(tmp_path / "postgres", durable=False, password_file=tmp_path / "postgres.password")
    again.start()
    try:
        assert again.password == password and make_url(again.url).password == password
        assert await _connect(again, again.password) == 1
        assert await _refused(again, None)
    finally:
        again.stop()


async def test_a_data_directory_from_before_passwords_is_secured_on_its_next_start(tmp_path: Path) -> None:
    old = EmbeddedPostgres(tmp_path / "postgres", durable=False).start()  # as `berth up` made it before: trust
    try:
        assert await _connect(old, None) == 1
    finally:
        old.stop()
    secured = EmbeddedPostgres(tmp_path / "postgres", durable=False, password_file=tmp_path / "postgres.password")
    secured.start()
    try:
        assert await _refused(secured, None)
        assert await _connect(secured, secured.password) == 1
    finally:
        secured.destroy()
