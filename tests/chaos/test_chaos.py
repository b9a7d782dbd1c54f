"""The chaos suite's short form: `berth up`'s supervised stack under load, each of its parts
killed with SIGKILL in turn and restarted by the supervisor, then the checks of `bench/chaos.py` (nothing lost,
duplicated or leaked; the database, the hosts and the API agree; every allocation in flight at a kill active or final
within 30 s of the part's return). `python -m bench.chaos` is the long form."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos import KILLABLE, ChaosReport, chaos_stack, run_chaos
from config.context import StackContext
from devstack.process import alive
from devstack.stack import DevStack

# Starts processes of its own (a stack, a CLI run): never in the quick tier (tests/tiers.py).
pytestmark = pytest.mark.slow


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[DevStack, StackContext]]:
    stack = chaos_stack(tmp_path / "state", agent_processes=2, say=lambda line: None)
    context = stack.start()
    pids = {part: stack.pid(part) for part in stack.parts()}
    try:
        yield stack, context
    finally:
        stack.stop()
    assert not [part for part, pid in pids.items() if pid and alive(pid)], "a part outlived the stack"


def test_one_of_three_control_workers_and_one_of_two_apis_killed_lose_duplicate_and_leak_nothing(
    tmp_path: Path,
) -> None:
    """The control plane as several replicas (3 control workers on the one queue, 2 APIs behind one
    address), one of each killed mid-flight: the checks of the short form hold, and the others carried the load."""
    stack = chaos_stack(
        tmp_path / "state", agent_processes=1, say=lambda line: None, control_workers=3, api_processes=2
    )
    context = stack.start()
    pids = {part: stack.pid(part) for part in stack.parts()}
    try:
        report: ChaosReport = asyncio.run(
            run_chaos(
                stack,
                context,
                parts=("control-worker-2", "api"),
                clients=3,
                in_flight=10,
                dwell=1.5,
                say=lambda line: None,
            )
        )
    finally:
        stack.stop()
    assert not [part for part, pid in pids.items() if pid and alive(pid)], "a part outlived the stack"
    assert [fault.part for fault in report.faults] == ["control-worker-2", "api"]
    assert report.created > 0 and sum(fault.in_flight for fault in report.faults) > 0, report
    assert report.failures() == [], report.model_dump_json(indent=2)
    assert all(fault.bounded for fault in report.faults), {f.part: f.settle_summary() for f in report.faults}


def test_killing_each_part_loses_duplicates_and_leaks_nothing(running: tuple[DevStack, StackContext]) -> None:
    stack, context = running
    report: ChaosReport = asyncio.run(
        run_chaos(stack, context, clients=3, in_flight=10, dwell=1.5, say=lambda line: None)
    )
    assert [fault.part for fault in report.faults] == list(KILLABLE)
    assert report.created > 0 and sum(fault.in_flight for fault in report.faults) > 0, report
    settle = {fault.part: fault.settle_summary() for fault in report.faults}
    print(f"settle seconds after each part came back: {settle}")  # shown with -s, and in the failure below
    assert report.failures() == [], report.model_dump_json(indent=2)
    assert all(fault.bounded for fault in report.faults), settle
    # Each part ended once while serving, the kill: none fell over because another was killed. A restart that
    # failed to start (the dev server's own random internal ports can be taken in the instant it picks them) is
    # retried by the supervisor and explained in its log; it is not the stack falling over.
    ended = {part: stack.ended_serving(part) for part in KILLABLE}
    log = stack.settings.state_dir / "logs" / "supervisor.log"
    assert set(ended.values()) == {1}, (ended, log.read_text())
