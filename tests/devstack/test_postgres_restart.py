"""A PostgreSQL killed with -9 starts again on its data directory even while one of its children still holds its
shared memory: PostgreSQL refuses to start until none does ("pre-existing shared memory block is still in use"), and
its children, each the leader of a session of its own, are found by no wait on the postmaster's session. The chaos
tests met that race now and then; here a backend is held stopped across the kill so the race is always lost."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import asyncpg

from devstack.postgres import EmbeddedPostgres, _attached, _shared_memory_id

HELD_SECONDS = 1.0


async def _backend_pid(server: EmbeddedPostgres) -> tuple[asyncpg.Connection, int]:
    connection = await asyncpg.connect(host="127.0.0.1", port=server.port, user="postgres", database="postgres")
    return connection, await connection.fetchval("SELECT pg_backend_pid()")


def test_a_killed_server_starts_again_once_its_last_child_lets_go_of_its_memory(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "data", durable=False).start()
    try:
        _connection, backend = asyncio.run(_backend_pid(server))
        segment = _shared_memory_id(server.data_dir / "postmaster.pid")
        assert segment is not None and _attached(segment)
        postmaster = server.running_pid()
        assert postmaster is not None
        os.kill(backend, signal.SIGSTOP)  # it cannot notice its postmaster's death while stopped
        os.kill(postmaster, signal.SIGKILL)
        assert server.process is not None
        server.process.wait()
        assert _attached(segment)  # the stopped backend still holds the dead server's memory

        resumed = threading.Timer(HELD_SECONDS, os.kill, (backend, signal.SIGCONT))
        resumed.start()
        started = time.monotonic()
        server.clear_stale_pid_file()
        waited = time.monotonic() - started
        resumed.join()
        assert waited >= HELD_SECONDS * 0.9 and not _attached(segment), waited
        assert not (server.data_dir / "postmaster.pid").exists()
        server.process = None
        server.start()  # refused while the backend was attached; now it starts
        assert server.running_pid() not in (None, postmaster)
    finally:
        server.destroy()
