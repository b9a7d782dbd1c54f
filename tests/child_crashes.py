"""No process a test starts may crash unseen: one that died of a crash signal fails the test during which that was
seen, unless the test sent that signal itself.

Why: such a child often dies without its test noticing. A supervisor restarts it, a fixture starts another, a test
reads only what it wrote; the suite stayed green while "Fatal Python error: Segmentation fault" and a thread dump
scrolled past in the terminal (children forked from a pytest worker inherit its faulthandler until they exec).

How: a pytest plugin (tests/conftest.py loads it). For the whole run `subprocess.Popen` records every child it
starts, whatever starts it: subprocess.run, asyncio's subprocesses, the dev stack's supervisor and the embedded
PostgreSQL in the test process. An audit hook records each signal this process sends (os.kill, os.killpg, which
Popen.send_signal, kill and terminate use too). After each test's teardown (its fixtures have ended; after the last
test, the session's too) every recorded child that has ended is looked at once. One that nobody has waited for yet
is read with waitid(WNOWAIT), which leaves it for its owner to reap.

A crash is a death by SIGSEGV, SIGABRT, SIGBUS, SIGILL or SIGFPE (Python's faulthandler, when on, prints its dump and
then dies of the same signal), or exit status 128 + one of them: how a shell reports a command that died so.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})
SHELL_STATUS = 128  # a shell's exit status for a command killed by signal N is 128 + N


class ChildCrashed(AssertionError):
    """A process started during the tests crashed: the message names each such process, its signal and its test."""


def crash_signal(returncode: int) -> signal.Signals | None:
    """The crash signal a child's return code says it died of (-N from Popen, 128 + N from a shell), else None."""
    number = -returncode if returncode < 0 else returncode - SHELL_STATUS
    try:
        sig = signal.Signals(number)
    except ValueError:
        return None
    return sig if sig in CRASH_SIGNALS else None


@dataclass
class _Child:
    process: subprocess.Popen[Any]
    started_during: str


@dataclass
class ChildWatch:
    """The children started and the signals sent while this watch is installed (or given to `started` and
    `signalled`); `check` raises ChildCrashed for those that crashed of a signal nobody here sent.

    Installed inside another watch (a test of this module), a watch takes over until it is uninstalled: what starts
    and what is sent meanwhile is its own, and the outer one never sees it."""

    during: str = "pytest's start"  # what runs now (a test's id), for the message
    _children: list[_Child] = field(default_factory=list)
    _sent: dict[int, set[int]] = field(default_factory=dict)  # pid (or process group) -> signals sent to it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def started(self, process: subprocess.Popen[Any]) -> None:
        with self._lock:
            self._children.append(_Child(process, self.during))

    def signalled(self, pid: int, sig: int) -> None:
        """`sig` was sent to `pid`; a negative pid, as os.kill takes it, is a process group."""
        with self._lock:
            self._sent.setdefault(abs(pid), set()).add(int(sig))

    def crashes(self) -> list[str]:
        """Forget every child that has ended, and say which of them crashed of a signal nobody here sent."""
        crashes = []
        with self._lock:
            for child in list(self._children):
                code = _returncode(child.process)
                if code is None:
                    continue
                self._children.remove(child)
                sent = self._sent.pop(child.process.pid, set())  # its pid may be another child's next
                sig = crash_signal(code)
                if sig is not None and int(sig) not in sent:
                    crashes.append(_describe(child, code, sig))
        return crashes

    def check(self) -> None:
        """`crashes`, raised as ChildCrashed when there are any."""
        if crashes := self.crashes():
            raise ChildCrashed("\n".join(crashes))

    def install(self) -> None:
        """Record every child Popen starts in this process, and every signal it sends, until `uninstall`."""
        global _original_init
        if not _watches:
            _original_init = subprocess.Popen.__init__
            subprocess.Popen.__init__ = _recording_init
        if not _audit_hook_added.is_set():
            sys.addaudithook(_audit)  # for the life of the process: Python cannot remove one
            _audit_hook_added.set()
        _watches.append(self)

    def uninstall(self) -> None:
        assert _watches and _watches[-1] is self, "watches are uninstalled innermost first"
        _watches.pop()
        if not _watches and _original_init is not None:
            subprocess.Popen.__init__ = _original_init


def _returncode(process: subprocess.Popen[Any]) -> int | None:
    """The child's return code when it has ended, without reaping it: its owner may still wait for it."""
    if process.returncode is not None or _waitid is None:
        return process.returncode
    try:
        ended = _waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already, by an owner that has not set returncode yet (asyncio's watcher)
        return None
    if ended is None:  # still running
        return None
    return ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status


def _describe(child: _Child, code: int, sig: signal.Signals) -> str:
    how = f"killed by {sig.name}" if code < 0 else f"exit status {code}, a shell's word for {sig.name}"
    command = child.process.args
    shown = shlex.join(map(str, command)) if isinstance(command, list | tuple) else str(command)
    return (
        f"process {child.process.pid} ({shown}) crashed: {how}, a signal the test did not send; "
        f"it was started during {child.started_during}"
    )


_waitid = getattr(os, "waitid", None)  # Linux has it; without it, a child counts once its owner has waited for it
_watches: list[ChildWatch] = []  # installed, innermost last: only it records
_original_init: Callable[..., None] | None = None
_audit_hook_added = threading.Event()


def _recording_init(process: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    assert _original_init is not None
    _original_init(process, *args, **kwargs)
    if _watches:
        _watches[-1].started(process)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in ("os.kill", "os.killpg") and _watches:
        _watches[-1].signalled(args[0], args[1])


# -- the plugin ----------------------------------------------------------------------------------------------------

_WATCH = ChildWatch()


def pytest_configure(config: pytest.Config) -> None:
    _WATCH.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    _WATCH.uninstall()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _WATCH.during = item.nodeid
    try:
        return (yield)
    finally:
        _WATCH.during = "the session's end" if nextitem is None else "the gap between two tests"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the test's fixtures (and after the last test, the session's) have stopped what they started."""
    try:
        return (yield)
    finally:
        if crashes := _WATCH.crashes():
            pytest.fail("\n".join(crashes), pytrace=False)  # the message says it all; the plugin's frames would not
