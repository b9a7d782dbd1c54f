"""The supervised dev stack as an operator sees it: each part its own process, a part killed with -9 reported,
restarted on the same address and serving again, and a stop that leaves nothing behind.

One stack for the module (starting one costs ~15 s on two cores); the tests kill its parts one after another and the
last one stops it.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from config.context import read_context
from config.settings import Settings
from config.worker_process import LIVENESS_SECONDS
from devstack.parts import alive_file
from devstack.process import alive
from devstack.stack import DevStack
from tests.workflows.lab import lab_fleet

# Starts processes of its own (a stack, a CLI run): never in the quick tier (tests/tiers.py).
pytestmark = pytest.mark.slow

PARTS = [
    "postgres",
    "temporal",
    "control-worker",
    "control-worker-2",
    "api",
    "api-2",
    "gateway",
    "agents-0",
    "agents-1",
]
FLEET = lab_fleet({"host-a": {"gpus": 2}, "host-b": {"gpus": 2}, "host-c": {"gpus": 2}})


class Terminal:
    """What `berth up` would have printed."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


@pytest.fixture(scope="module")
def terminal() -> Terminal:
    return Terminal()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, terminal: Terminal) -> Iterator[DevStack]:
    home = tmp_path_factory.mktemp("supervised")
    fleet = home / "fleet.yaml"
    fleet.write_text(FLEET)
    stack = DevStack(
        Settings(state_dir=home / "state"), fleet, say=terminal, agent_processes=2, control_workers=2, api_processes=2
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def _state(stack: DevStack) -> Path:
    return stack.settings.state_dir


def _kill(stack: DevStack, part: str) -> tuple[int, int]:
    """kill -9 the part as an operator would, by the pid context.json gives; returns (old pid, new pid)."""
    context = read_context(stack.settings)
    assert context is not None
    old = context.processes[part]
    assert old == stack.pid(part)
    os.kill(old, signal.SIGKILL)
    new = stack.wait_ready(part, 60, replacing=old)
    return old, new


def _supervisor_reported(stack: DevStack, terminal: Terminal, line: str) -> None:
    assert line in terminal.lines
    assert line in (_state(stack) / "logs" / "supervisor.log").read_text()


def _api(stack: DevStack) -> httpx.Client:
    assert stack.context is not None and stack.context.api_url
    token = stack.context.tenant_tokens["acme"]
    return httpx.Client(base_url=stack.context.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _answer(client: httpx.Client, method: str, path: str, timeout: float = 30, **kwargs: object) -> httpx.Response:
    """The first answer that is not a 503 (a dependency coming back); never a 500 meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            response = client.request(method, path, **kwargs)  # type: ignore[arg-type]
        except httpx.TransportError:
            response = None
        if response is not None:
            assert response.status_code < 500 or response.status_code == 503, response.text
            if response.status_code != 503:
                return response
        assert time.monotonic() < deadline, f"{method} {path} still unavailable after {timeout}s"
        time.sleep(0.2)


def _allocation_becomes_active(stack: DevStack) -> None:
    with _api(stack) as client:
        created = _answer(client, "POST", "/v1/allocations", json={"gpu_count": 1, "shape": "gpu_slice"})
        assert created.status_code == 202, created.text
        allocation = created.json()["id"]
        deadline = time.monotonic() + 60
        while (current := _answer(client, "GET", f"/v1/allocations/{allocation}").json())["state"] != "active":
            assert current["state"] not in ("failed", "cancelled"), current
            assert time.monotonic() < deadline, f"{allocation} stuck in {current['state']}"
            time.sleep(0.2)
        assert _answer(client, "DELETE", f"/v1/allocations/{allocation}").status_code == 202


def test_each_part_is_its_own_process_and_node_tokens_stay_off_command_lines(stack: DevStack) -> None:
    assert stack.parts() == PARTS
    context = read_context(stack.settings)
    assert context is not None
    pids = {part: stack.pid(part) for part in PARTS}
    assert context.processes == pids
    assert len(set(pids.values())) == len(PARTS) and os.getpid() not in pids.values()
    for node in ("host-a", "host-b", "host-c"):
        token_file = _state(stack) / "tokens" / node
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        for pid in pids.values():
            assert token not in Path(f"/proc/{pid}/cmdline").read_text()


def test_agents_know_the_api_and_the_gateway_and_nothing_else_of_the_control_plane(stack: DevStack) -> None:
    """A GPU host is the most exposed machine: its agents are given no Temporal address and no database URL."""
    context = read_context(stack.settings)
    assert context is not None and context.gateway_address
    for part in ("agents-0", "agents-1"):
        pid = stack.pid(part)
        environment = dict(
            entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
        )
        assert environment["BERTH_NODE_GATEWAY"] == context.gateway_address
        assert environment["BERTH_API_URL"] == context.api_url
        for secret in ("BERTH_DATABASE_URL", "BERTH_TEMPORAL_ADDRESS", "BERTH_GATEWAY_KEY_FILE"):
            assert secret not in environment, f"{part} was given {secret}"
        assert context.temporal_address not in Path(f"/proc/{pid}/environ").read_text()


def test_each_control_worker_keeps_its_liveness_file_fresh_while_it_runs(stack: DevStack) -> None:
    """What a Kubernetes probe reads (deploy/kubernetes): the file's age, touched every 10 s by a running worker."""
    for part in ("control-worker", "control-worker-2"):
        path = alive_file(stack.settings.state_dir.resolve(), part)
        first = path.stat().st_mtime
        assert time.time() - first < LIVENESS_SECONDS + 5, part
        deadline = time.monotonic() + LIVENESS_SECONDS + 5
        while path.stat().st_mtime == first:
            assert time.monotonic() < deadline, f"{part} stopped touching {path}"
            time.sleep(0.5)


def test_a_killed_control_worker_is_reported_restarted_and_serves_new_allocations(
    stack: DevStack, terminal: Terminal
) -> None:
    old, new = _kill(stack, "control-worker")
    _supervisor_reported(stack, terminal, "control-worker exited (killed by SIGKILL); restarting in 1s (restart #1)")
    _supervisor_reported(stack, terminal, f"control-worker restarted (pid {new})")
    assert (stack.restarts("control-worker"), new == old) == (1, False)
    context = read_context(stack.settings)
    assert context is not None and context.processes["control-worker"] == new
    _allocation_becomes_active(stack)


def test_a_killed_postgres_restarts_on_the_same_data_directory_and_the_api_answers_again(
    stack: DevStack, terminal: Terminal
) -> None:
    old, _new = _kill(stack, "postgres")
    _supervisor_reported(stack, terminal, "postgres exited (killed by SIGKILL); restarting in 1s (restart #1)")
    server_log = (_state(stack) / "postgres" / "server.log").read_text()
    assert "database system was not properly shut down; automatic recovery in progress" in server_log
    assert 'lock file "postmaster.pid" already exists' not in server_log
    with _api(stack) as client:
        assert _answer(client, "GET", "/v1/allocations").status_code == 200
    assert not alive(old)
    _allocation_becomes_active(stack)


def test_a_killed_temporal_server_restarts_and_the_workers_reconnect_on_their_own(
    stack: DevStack, terminal: Terminal
) -> None:
    workers = {part: stack.pid(part) for part in ("control-worker", "agents-0", "agents-1", "api")}
    _kill(stack, "temporal")
    _supervisor_reported(stack, terminal, "temporal exited (killed by SIGKILL); restarting in 1s (restart #1)")
    _allocation_becomes_active(stack)
    assert {part: stack.pid(part) for part in workers} == workers  # nobody else needed a restart


def test_a_killed_api_comes_back_on_the_same_url(stack: DevStack, terminal: Terminal) -> None:
    assert stack.context is not None
    old = stack.pid("api")
    assert old is not None
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(old):  # gone, its port closed (a request sent in the instant it dies is lost with it)
        assert time.monotonic() < deadline, f"api {old} outlived SIGKILL"
        time.sleep(0.01)
    # The other API process answers on the one address while this one is down (the balancer skips it).
    assert httpx.get(f"{stack.context.api_url}/healthz", timeout=10).status_code == 200
    stack.wait_ready("api", 60, replacing=old)
    _supervisor_reported(stack, terminal, "api exited (killed by SIGKILL); restarting in 1s (restart #1)")
    assert httpx.get(f"{stack.context.api_url}/healthz", timeout=10).status_code == 200


def test_one_agent_process_killed_alone_restarts_without_the_others(stack: DevStack, terminal: Terminal) -> None:
    other = stack.pid("agents-0")
    _kill(stack, "agents-1")
    _supervisor_reported(stack, terminal, "agents-1 exited (killed by SIGKILL); restarting in 1s (restart #1)")
    assert (stack.pid("agents-0"), stack.restarts("agents-0")) == (other, 0)
    _allocation_becomes_active(stack)


def test_stop_leaves_no_process_and_no_context(stack: DevStack) -> None:
    pids = {part: stack.pid(part) for part in stack.parts()}
    assert all(pids.values())
    stack.stop()
    assert [part for part, pid in pids.items() if pid is not None and alive(pid)] == []
    assert not stack.settings.context_file.exists()


def test_kill_9_of_berth_up_takes_every_part_with_it(tmp_path: Path) -> None:
    fleet, state = tmp_path / "fleet.yaml", tmp_path / "state"
    fleet.write_text(FLEET)
    up = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--fleet", str(fleet), "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []  # what `berth up` prints, read as it comes: its table follows the context file
    reader = threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")) if up.stdout else None)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        # The whole table is printed (its last row names the supervisor log) before berth up is killed.
        while not any(line.split()[:2] == ["Supervisor", "log"] for line in list(lines)):
            assert up.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        processes = json.loads((state / "context.json").read_text())["processes"]
    finally:
        up.kill()
        up.wait(timeout=30)
        reader.join(timeout=30)
    printed = "".join(lines)
    assert list(processes) == ["postgres", "temporal", "control-worker", "api", "gateway", "agents"]
    for part, pid in processes.items():
        assert any(line.split() == [part, "pid", str(pid)] for line in printed.splitlines()), printed
    deadline = time.monotonic() + 30
    while running := [part for part, pid in processes.items() if alive(pid)]:
        assert time.monotonic() < deadline, f"still running after kill -9 of berth up: {running}"
        time.sleep(0.2)
