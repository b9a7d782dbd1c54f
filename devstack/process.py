"""Start service processes that cannot outlive the process that started them, and clear up after one that died.

Each child is asked (Linux prctl PR_SET_PDEATHSIG) to receive a signal when its parent dies, so even a `kill -9` of
`berth up` or of a test run leaves no PostgreSQL or Temporal server behind. The signal is tied to the *thread* that
forked the child (prctl(2)), which is why the supervisor spawns every child from its own long-lived thread.

Each child leads its own session, so whatever it forked (PostgreSQL's backends) can be found by session id after
the child itself died, and waited for before a replacement starts on the same data directory and port.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

_PR_SET_PDEATHSIG = 1


# util-linux's `setpriv --pdeathsig` sets the signal in the child and then runs the command, so no Python runs in the
# forked child: Python code there (a `preexec_fn`) runs the fork handlers other libraries registered and may touch
# locks their threads (Temporal's, grpc's) held at the fork, and such a child died of SIGSEGV before its exec now and
# then. A system without setpriv (it is in util-linux, essential on Debian) falls back to the preexec_fn, with prctl
# resolved here in the parent rather than loaded in the child.
#
# setpriv also makes the child another user (PostgreSQL's, under root), for the same reason: given `user=`, Popen
# starts the child with fork() rather than vfork(), and fork() runs those handlers even with no Python in the child.
# gRPC's handler restarts its threads in the child, which then died of SIGSEGV, SIGBUS or SIGABRT before its exec,
# about once in a few hundred starts from a process whose gRPC threads run (the test suite's, with its Temporal
# clients and node gateway), where the parent saw only a start that failed.
_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None
_prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl if sys.platform.startswith("linux") else None


def _setpriv_user(user: str | None) -> list[str]:
    """setpriv's options that make the command it runs `user`, in that user's groups (none for None)."""
    if user is None:
        return []
    entry = pwd.getpwnam(user)
    return [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups"]


def as_user(command: list[str], user: str | None) -> tuple[list[str], str | None]:
    """`command` made to run as `user` (None: as ourselves), and the `user=` still to give Popen: None when setpriv
    switches, so that Popen can start the child with vfork() (see above)."""
    if user is None or _SETPRIV is None:
        return command, user
    return [_SETPRIV, *_setpriv_user(user), "--", *command], None


def _launch(
    command: list[str], sig: signal.Signals, user: str | None
) -> tuple[list[str], Callable[[], None] | None, str | None]:
    """The command to run, the preexec_fn and the `user=` to give Popen (None when not needed) that make the child
    run as `user` and get `sig` when the thread that forked it dies. setpriv sets the signal after it switched user:
    the kernel clears it at a change of user."""
    if _SETPRIV is not None:
        return [_SETPRIV, f"--pdeathsig={sig.name}", *_setpriv_user(user), "--", *command], None, None
    prctl = _prctl
    if prctl is None:
        return command, None, user
    number = int(sig)

    def _set() -> None:
        prctl(_PR_SET_PDEATHSIG, number)

    return command, _set, user


def spawn(
    command: list[str],
    log_file: Path,
    *,
    user: str | None = None,
    on_parent_death: signal.Signals = signal.SIGTERM,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Run `command` in its own session with output appended to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command, preexec, user = _launch(command, on_parent_death, user)
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            user=user,
            env=None if env is None else dict(env),
            start_new_session=True,
            preexec_fn=preexec,
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


def describe_exit(returncode: int) -> str:
    """`killed by SIGKILL`, `exited with status 1`: how an operator reads a child's end."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, session id) of a live process from /proc, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    # after "(comm)": state ppid pgrp session ...
    return fields[0].decode(), int(fields[3])


def alive(pid: int) -> bool:
    """Running (not a zombie waiting to be reaped, not dead)."""
    if not sys.platform.startswith("linux"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # alive, owned by another user
        return True
    found = _stat(pid)
    return found is not None and found[0] not in ("Z", "X")


def session_members(session: int) -> list[int]:
    """Live processes (zombies excluded: they hold no port, file or shared memory) in `session`."""
    if not sys.platform.startswith("linux"):
        return []
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None and found[1] == session and found[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


def clear_session(session: int, grace: float = 10.0) -> list[int]:
    """Wait for what a dead session leader left in its session (PostgreSQL's backends notice their postmaster died
    and exit by themselves within milliseconds) and SIGKILL whatever is still there after `grace` seconds.

    The session is one we created for a child we started, so everything in it is ours to end. Returns the pids
    that had to be killed."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not session_members(session):
            return []
        time.sleep(0.05)
    killed = session_members(session)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while session_members(session) and time.monotonic() < deadline + 5.0:
        time.sleep(0.05)
    return killed
