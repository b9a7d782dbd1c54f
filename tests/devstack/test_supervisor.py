"""The supervisor's restart policy on real child processes, with short delays: what it says, when it restarts, and
that it leaves nothing running."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from devstack.process import alive, session_members
from devstack.supervisor import Backoff, Part, Supervisor


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _wait_for(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _exits(tmp_path: Path, backoff: Backoff, code: str, restarts: int) -> list[str]:
    """The supervisor's lines about a part running `code`, until it was restarted `restarts` times; each line is
    both said on the terminal and in the supervisor's log."""
    said: list[str] = []
    supervisor = Supervisor(tmp_path / "supervisor.log", said.append, backoff)
    supervisor.start()
    try:
        supervisor.add(Part("part", _python(code), tmp_path / "part.log"))
        _wait_for(lambda: supervisor.restarts("part") >= restarts)
    finally:
        supervisor.stop()
    exits = [line for line in said if line.startswith("part exited")]
    assert all(line in (tmp_path / "supervisor.log").read_text() for line in exits)
    return exits[:restarts]


def test_a_part_that_keeps_failing_waits_longer_each_time_up_to_the_maximum(tmp_path: Path) -> None:
    assert _exits(tmp_path, Backoff(initial=0.1, maximum=0.4), "import sys; sys.exit(3)", 4) == [
        "part exited (exited with status 3); restarting in 0.1s (restart #1)",
        "part exited (exited with status 3); restarting in 0.2s (restart #2)",
        "part exited (exited with status 3); restarting in 0.4s (restart #3)",
        "part exited (exited with status 3); restarting in 0.4s (restart #4)",
    ]


def test_a_part_that_ends_itself_leaves_the_end_of_its_log_in_the_supervisors(tmp_path: Path) -> None:
    """Why it ended, where the operator reads the restarts (a port taken, say), not only the exit status."""
    code = "import sys; print('starting'); print('error: [Errno 98] address already in use'); sys.exit(1)"
    _exits(tmp_path, Backoff(initial=0.1), code, 1)
    log = (tmp_path / "supervisor.log").read_text()
    assert "part| error: [Errno 98] address already in use" in log and "part| starting" in log


def test_a_restart_that_fails_to_start_is_told_apart_from_a_part_that_ended_while_serving(tmp_path: Path) -> None:
    """Killed once while serving; its first restart ends before it is ready (a port taken, say) and the next one
    serves: one end while serving, two restarts, and the log says which was which."""
    marker = tmp_path / "fail-once"
    code = (
        "import os, sys, time\n"
        f"if os.path.exists({str(marker)!r}):\n    os.remove({str(marker)!r}); sys.exit(4)\n"
        "time.sleep(60)"
    )
    supervisor = Supervisor(tmp_path / "supervisor.log", lambda line: None, Backoff(initial=0.1))
    supervisor.start()
    try:
        supervisor.add(Part("part", _python(code), tmp_path / "part.log"))
        first = supervisor.wait_ready("part")
        marker.touch()
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: supervisor.restarts("part") == 2)
        supervisor.wait_ready("part", replacing=first)
        assert (supervisor.ended_serving("part"), supervisor.restarts("part")) == (1, 2)
    finally:
        supervisor.stop()
    log = (tmp_path / "supervisor.log").read_text()
    assert "part exited (killed by SIGKILL)" in log and "part exited before it was ready (exited with status 4)" in log


def test_a_restarted_part_that_ends_while_serving_counts_so_with_nobody_waiting_for_it(tmp_path: Path) -> None:
    """As under `berth up`, where nothing waits for a restarted part: the supervisor itself sees it serve (its ready
    check, once a second), so its later end is a second end while serving, not a start that failed."""
    ready_file = tmp_path / "ready"
    code = f"import os, time; open({str(ready_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"

    def ready(pid: int) -> bool:
        return ready_file.exists() and ready_file.read_text() == str(pid)

    supervisor = Supervisor(tmp_path / "supervisor.log", lambda line: None, Backoff(initial=0.1))
    supervisor.start()
    try:
        supervisor.add(Part("part", _python(code), tmp_path / "part.log", ready=ready))
        first = supervisor.wait_ready("part")
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: supervisor.restarts("part") == 1 and supervisor.pid("part") not in (None, first))
        second = supervisor.pid("part")
        _wait_for(lambda: supervisor._supervised("part").ready_pid == second)  # seen serving by the supervisor
        os.kill(second, signal.SIGKILL)
        _wait_for(lambda: supervisor.restarts("part") == 2)
        assert supervisor.ended_serving("part") == 2
    finally:
        supervisor.stop()
    log = (tmp_path / "supervisor.log").read_text()
    assert log.count("part exited (killed by SIGKILL)") == 2 and "before it was ready" not in log, log


def test_a_part_that_stayed_up_a_while_restarts_after_the_initial_delay_again(tmp_path: Path) -> None:
    exits = _exits(tmp_path, Backoff(initial=0.1, stable_after=0.3), "import time; time.sleep(0.5)", 3)
    assert exits == [f"part exited (exited with status 0); restarting in 0.1s (restart #{n})" for n in (1, 2, 3)]


def test_what_a_dead_part_left_in_its_session_is_cleared_and_stop_leaves_nothing(tmp_path: Path) -> None:
    """A part that forked a child and was killed (as PostgreSQL's postmaster leaves its backends): the supervisor
    waits for, then kills, what is left in the part's session before the restart."""
    grandchild = tmp_path / "grandchild.pid"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(grandchild)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    supervisor = Supervisor(tmp_path / "supervisor.log", lambda _line: None, Backoff(initial=0.1), leftover_grace=0.5)
    supervisor.start()
    try:
        first = supervisor.add(Part("forking", _python(code), tmp_path / "forking.log"))
        _wait_for(grandchild.exists)
        _wait_for(lambda: grandchild.read_text().strip() != "")
        left_behind = int(grandchild.read_text())
        grandchild.unlink()
        os.kill(first, signal.SIGKILL)
        second = supervisor.wait_ready("forking", 30, replacing=first)
        assert second != first
        assert not alive(left_behind) and session_members(first) == []
        assert "killed 1 leftover process(es)" in (tmp_path / "supervisor.log").read_text()
        _wait_for(grandchild.exists)
        _wait_for(lambda: grandchild.read_text().strip() != "")
        second_left = int(grandchild.read_text())
    finally:
        supervisor.stop()
    assert not alive(second) and not alive(second_left)
