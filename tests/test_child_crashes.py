"""A process a test started that crashed fails the test (tests/child_crashes.py), unless the test sent the signal:
a child that segfaults itself, under Python's faulthandler as the one seen in a green run was, or behind a shell, or
before anyone waited for it, is named with its signal; one the test killed on purpose is not."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.child_crashes import ChildCrashed, ChildWatch, crash_signal

REPO = Path(__file__).resolve().parents[1]
SEGFAULT = [sys.executable, "-X", "faulthandler", "-c", "import ctypes; ctypes.string_at(0)"]


@pytest.fixture
def watch() -> Iterator[ChildWatch]:
    """A watch of this test's own, installed inside the suite's: the crashes started here are its alone."""
    own = ChildWatch(during="test_child_crashes")
    own.install()
    try:
        yield own
    finally:
        own.uninstall()


def _ended(process: subprocess.Popen[bytes]) -> None:
    """Wait until the child has ended, without reaping it (as a zombie, nobody has looked at it yet)."""
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)


def test_a_child_that_segfaults_itself_fails_the_check_naming_it_and_its_signal(watch: ChildWatch) -> None:
    child = subprocess.Popen(SEGFAULT, stderr=subprocess.PIPE)
    _, stderr = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGSEGV
    assert b"Fatal Python error: Segmentation fault" in stderr  # what scrolled past in the terminal
    with pytest.raises(ChildCrashed) as crashed:
        watch.check()
    message = str(crashed.value)
    assert f"process {child.pid} ({shlex.join(SEGFAULT)}) crashed: killed by SIGSEGV" in message
    assert "a signal the test did not send" in message and "started during test_child_crashes" in message
    watch.check()  # said once: the child is forgotten


def test_a_crash_nobody_waited_for_is_seen_and_its_owner_can_still_reap_it(watch: ChildWatch) -> None:
    child = subprocess.Popen(SEGFAULT, stderr=subprocess.DEVNULL)
    _ended(child)
    with pytest.raises(ChildCrashed, match=f"process {child.pid} .* killed by SIGSEGV"):
        watch.check()
    assert child.wait(timeout=5) == -signal.SIGSEGV


def test_a_crash_reported_by_a_shell_is_a_crash(watch: ChildWatch) -> None:
    """A shell says 128 + N for a command killed by signal N (the `; exit` keeps dash from exec'ing it in place)."""
    shell = subprocess.run(["sh", "-c", f"{shlex.join(SEGFAULT)} 2>/dev/null; exit $?"], check=False)
    assert shell.returncode == 128 + signal.SIGSEGV
    with pytest.raises(ChildCrashed, match="exit status 139, a shell's word for SIGSEGV"):
        watch.check()


def test_signals_the_test_sent_are_not_crashes(watch: ChildWatch) -> None:
    aborted = subprocess.Popen(["sleep", "60"])
    aborted.send_signal(signal.SIGABRT)
    segfaulted = subprocess.Popen(["sleep", "60"], start_new_session=True)
    os.killpg(segfaulted.pid, signal.SIGSEGV)
    killed = subprocess.Popen(["sleep", "60"])
    killed.kill()  # SIGKILL, as the chaos tests send: never a crash
    exited = subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=False)
    assert [p.wait(timeout=5) for p in (aborted, segfaulted, killed)] + [exited.returncode] == [
        -signal.SIGABRT,
        -signal.SIGSEGV,
        -signal.SIGKILL,
        3,
    ]
    watch.check()


def test_a_running_child_is_looked_at_again_once_it_has_ended(watch: ChildWatch) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import ctypes, sys; sys.stdin.read(); ctypes.string_at(0)"],
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    watch.check()  # still running: nothing to say yet
    assert child.stdin is not None
    child.stdin.close()
    _ended(child)
    with pytest.raises(ChildCrashed, match="killed by SIGSEGV"):
        watch.check()
    child.wait(timeout=5)


@pytest.mark.parametrize(
    ("returncode", "crash"),
    [
        (-signal.SIGSEGV, signal.SIGSEGV),
        (-signal.SIGABRT, signal.SIGABRT),
        (-signal.SIGBUS, signal.SIGBUS),
        (-signal.SIGILL, signal.SIGILL),
        (-signal.SIGFPE, signal.SIGFPE),
        (134, signal.SIGABRT),
        (139, signal.SIGSEGV),
        (-signal.SIGKILL, None),
        (-signal.SIGTERM, None),
        (0, None),
        (1, None),
        (130, None),  # Ctrl-C through a shell: asked for, not a crash
    ],
)
def test_which_return_codes_are_crashes(returncode: int, crash: signal.Signals | None) -> None:
    assert crash_signal(returncode) == crash


@pytest.mark.slow  # a pytest run of its own
def test_in_a_suite_a_crash_fails_the_test_that_started_it_at_its_teardown(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin as the suite loads it: a green test whose child crashed is an error at its teardown, naming it; a
    test that killed its child with SIGSEGV itself passes."""
    pytester.makepyfile(
        test_children=textwrap.dedent(
            f"""
            import signal, subprocess

            def test_ignores_its_crashed_child():
                subprocess.run({SEGFAULT!r}, stderr=subprocess.DEVNULL, check=False)

            def test_kills_its_child_itself():
                child = subprocess.Popen(["sleep", "60"])
                child.send_signal(signal.SIGSEGV)
                child.wait()
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess("-p", "tests.child_crashes", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_ignores_its_crashed_child*",
            "process * crashed: killed by SIGSEGV, a signal the test did not send;"
            " it was started during test_children.py::test_ignores_its_crashed_child",
        ]
    )
