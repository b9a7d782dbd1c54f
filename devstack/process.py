"""Start service processes that cannot outlive the process that started them.

Each child is asked (Linux prctl PR_SET_PDEATHSIG) to receive a signal when its parent dies, so even a `kill -9` of
`berth up` or of a test run leaves no PostgreSQL or Temporal server behind.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None

    def _set() -> None:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return _set


def spawn(
    command: list[str], log_file: Path, *, user: str | None = None, on_parent_death: signal.Signals = signal.SIGTERM
) -> subprocess.Popen[bytes]:
    """Run `command` in its own session with output appended to `log_file`."""
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            user=user,
            start_new_session=True,
            preexec_fn=_die_with_parent(on_parent_death),
        )


def stop(process: subprocess.Popen[bytes] | None, sig: signal.Signals = signal.SIGTERM, timeout: float = 15.0) -> None:
    """Ask politely, then insist."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
