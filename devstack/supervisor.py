"""The supervisor inside `berth up`: every part of the stack is a child process it starts, reaps, and restarts.

    add(part) -> spawn (on the supervisor's thread) ─► running ─► exits (any way, kill -9 included)
                                                         ▲          │ one line on the terminal + logs/supervisor.log
                                                         │          ▼
                                      before_start (stale files) ◄─ clear its session (leftover children) ◄─ backoff

A part restarts on the same command, hence the same port and data directory, so every address in context.json
stays valid and nothing that depends on it needs restarting. The delay before a restart starts at one second and
doubles up to thirty; a part that stayed up a while (`Backoff.stable_after`) starts again from one second.

Children are spawned only from the supervisor's own thread: PR_SET_PDEATHSIG fires when the *thread* that forked a
child ends, so that thread must live as long as the stack (process.py).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from devstack.process import alive, clear_session, describe_exit, spawn, stop

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    initial: float = 1.0
    maximum: float = 30.0
    stable_after: float = 60.0  # a part up this long counts as healthy again: its next restart waits `initial`


@dataclass
class Part:
    """One supervised child: how to start it, how to tell it is serving, and how to stop it."""

    name: str
    command: list[str]
    log_file: Path
    env: Mapping[str, str] | None = None
    user: str | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    ready: Callable[[int], bool] | None = None  # given the live pid: is it serving? (None: once it runs)
    before_start: Callable[[], None] | None = None  # clears what a dead predecessor left (a stale pid file)


class PartFailed(RuntimeError):
    """A part exited while the stack was starting, or never became ready."""


@dataclass
class _Supervised:
    part: Part
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    ready_pid: int | None = None  # the last of its processes seen serving
    ready_checked_at: float = 0.0  # when the supervisor last asked a process not yet seen serving
    ended_serving: int = 0  # times a process of it ended after it was seen serving (a kill, a crash)
    delay: float = 1.0
    restart_at: float | None = None
    last_exit: str | None = None


_END = object()
READY_CHECK_SECONDS = 1.0


def _last_lines(log_file: Path, count: int = 5) -> list[str]:
    """The last non-blank lines of a part's log (read from its end: a log may be large)."""
    try:
        with open(log_file, "rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - 4096))
            tail = log.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in tail.splitlines() if line.strip()][-count:]


@dataclass
class Supervisor:
    log_file: Path
    say: Callable[[str], None] = print
    backoff: Backoff = field(default_factory=Backoff)
    on_change: Callable[[], None] | None = None  # after a restart (the pids moved)
    poll_seconds: float = 0.1
    leftover_grace: float = 10.0  # how long what a dead part left in its session gets to exit before SIGKILL
    _parts: dict[str, _Supervised] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _jobs: queue.Queue[object] = field(default_factory=queue.Queue)
    _stopping: bool = False
    _thread: threading.Thread | None = None

    # -- the supervisor's thread -------------------------------------------------------------------------------------

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="berth-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.poll_seconds)
            except queue.Empty:
                job = None
            if job is _END:
                return
            if callable(job):
                job()
            try:
                self._check()
            except Exception as error:  # noqa: BLE001 - this thread must outlive everything: its children die with it
                self._log(f"supervisor error: {error!r}", terminal=True)

    def _on_thread(self, function: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return function()
        future: Future[T] = Future()

        def job() -> None:
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - handed back to the caller
                future.set_exception(error)

        self._jobs.put(job)
        return future.result()

    def _log(self, line: str, terminal: bool = False) -> None:
        with open(self.log_file, "a") as log:
            log.write(f"{datetime.now().isoformat(timespec='milliseconds')} {line}\n")
        if terminal:
            self.say(line)

    def _spawn(self, supervised: _Supervised) -> None:
        part = supervised.part
        if part.before_start is not None:
            part.before_start()
        supervised.process = spawn(
            part.command, part.log_file, user=part.user, on_parent_death=part.stop_signal, env=part.env
        )
        supervised.started_at = time.monotonic()

    def _check(self) -> None:
        with self._lock:
            if self._stopping:
                return
            for name, supervised in self._parts.items():
                process = supervised.process
                if process is not None and process.poll() is not None:
                    self._died(name, supervised, process)
                elif process is not None and process.pid != supervised.ready_pid:
                    self._check_ready(supervised, process.pid)
                elif (
                    process is None and supervised.restart_at is not None and time.monotonic() >= supervised.restart_at
                ):
                    self._restart(name, supervised)

    def _died(self, name: str, supervised: _Supervised, process: subprocess.Popen[bytes]) -> None:
        if time.monotonic() - supervised.started_at >= self.backoff.stable_after:
            supervised.delay = self.backoff.initial
        delay = supervised.delay
        supervised.delay = min(delay * 2, self.backoff.maximum)
        supervised.process = None
        supervised.last_exit = describe_exit(process.returncode)
        serving = process.pid == supervised.ready_pid
        supervised.ended_serving += serving
        unready = " before it was ready" if supervised.ready_pid is not None and not serving else ""
        self._log(
            f"{name} exited{unready} ({supervised.last_exit}); restarting in {delay:g}s"
            f" (restart #{supervised.restarts + 1})",
            terminal=True,
        )
        if process.returncode > 0:  # it ended itself: say why, as its log has it
            for line in _last_lines(supervised.part.log_file):
                self._log(f"{name}| {line}")
        leftovers = clear_session(process.pid, self.leftover_grace)
        if leftovers:
            self._log(f"{name}: killed {len(leftovers)} leftover process(es) {leftovers} of its session")
        supervised.restart_at = time.monotonic() + delay

    def _check_ready(self, supervised: _Supervised, pid: int) -> None:
        """Once a second until it serves, ask whether a process of the part does: so that when it ends, the log can
        say whether it had served (a crash) or had not yet (a start that failed), whoever waits for it or not."""
        ready = supervised.part.ready
        if ready is None or time.monotonic() < supervised.ready_checked_at + READY_CHECK_SECONDS:
            return
        supervised.ready_checked_at = time.monotonic()
        if ready(pid):
            supervised.ready_pid = pid

    def _restart(self, name: str, supervised: _Supervised) -> None:
        supervised.restart_at = None
        supervised.restarts += 1
        try:
            self._spawn(supervised)
        except OSError as error:
            supervised.restart_at = time.monotonic() + supervised.delay
            supervised.delay = min(supervised.delay * 2, self.backoff.maximum)
            self._log(f"{name} could not be started ({error}); trying again in {supervised.delay:g}s", terminal=True)
            return
        assert supervised.process is not None
        self._log(f"{name} restarted (pid {supervised.process.pid})", terminal=True)
        if self.on_change is not None:
            self.on_change()

    # -- the interface -----------------------------------------------------------------------------------------------

    def add(self, part: Part) -> int:
        """Start `part` and supervise it from now on; returns its pid (not waiting for it to be ready)."""
        supervised = _Supervised(part, delay=self.backoff.initial)

        def start() -> int:
            with self._lock:
                if self._stopping:
                    raise PartFailed(f"the stack is stopping: {part.name} not started")
                self._spawn(supervised)
                self._parts[part.name] = supervised
                assert supervised.process is not None
                self._log(f"{part.name} started (pid {supervised.process.pid})")
                return supervised.process.pid

        return self._on_thread(start)

    def parts(self) -> list[str]:
        with self._lock:
            return list(self._parts)

    def _supervised(self, name: str) -> _Supervised:
        with self._lock:
            try:
                return self._parts[name]
            except KeyError:
                raise KeyError(f"no part {name!r}; the parts are {', '.join(self._parts)}") from None

    def pid(self, name: str) -> int | None:
        """The live pid of the part, None while it is down."""
        process = self._supervised(name).process
        return process.pid if process is not None and alive(process.pid) else None

    def pids(self) -> dict[str, int]:
        return {name: pid for name in self.parts() if (pid := self.pid(name)) is not None}

    def restarts(self, name: str) -> int:
        return self._supervised(name).restarts

    def ended_serving(self, name: str) -> int:
        """How many times the part ended after it was seen serving: a restart that failed to start is not counted
        (its end is in the log, with the reason)."""
        return self._supervised(name).ended_serving

    def wait_ready(
        self, name: str, timeout: float = 60.0, *, replacing: int | None = None, starting: bool = False
    ) -> int:
        """Return the part's pid once it runs and is ready.

        `replacing`: a pid just killed by hand, never taken for ready even in the instant before the kernel ends it.
        `starting`: the stack is starting, so a part that exits fails at once with the end of its log rather than
        waiting for its restart."""
        deadline = time.monotonic() + timeout
        while True:
            supervised = self._supervised(name)
            process = supervised.process
            if process is not None and process.pid != replacing and alive(process.pid):
                ready = supervised.part.ready
                if ready is None or ready(process.pid):
                    with self._lock:
                        supervised.ready_pid = process.pid
                    return process.pid
            elif starting and (process is None or process.poll() is not None):
                ended = supervised.last_exit if process is None else describe_exit(process.poll() or 0)
                raise PartFailed(self._failure(supervised, ended or "exited"))
            if time.monotonic() > deadline:
                raise PartFailed(self._failure(supervised, f"not ready within {timeout:g}s"))
            time.sleep(0.1)

    @staticmethod
    def _failure(supervised: _Supervised, what: str) -> str:
        part = supervised.part
        try:
            tail = part.log_file.read_text(errors="replace")[-1500:].strip()
        except OSError:
            tail = ""
        return f"{part.name} {what} (log {part.log_file})" + (f":\n{tail}" if tail else "")

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every part, newest first, and everything left in their sessions; then end the thread."""
        with self._lock:
            self._stopping = True
            stopping = list(reversed(self._parts.values()))
        for supervised in stopping:
            process = supervised.process
            if process is not None:
                stop(process, supervised.part.stop_signal, timeout)
                clear_session(process.pid, self.leftover_grace)
                self._log(f"{supervised.part.name} stopped")
        if self._thread is not None and self._thread.is_alive():
            self._jobs.put(_END)
            self._thread.join(timeout)
