"""`berth up` as a person runs it in a terminal: services answer, the fleet is applied, a second `berth up` reuses the
running stack, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import asyncpg
import psutil
import pytest
from sqlalchemy.engine import make_url

# Starts processes of its own (a stack, a CLI run): never in the quick tier (tests/tiers.py).
pytestmark = pytest.mark.slow

BERTH = [sys.executable, "-m", "cli.main"]


def _wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.2)
    raise AssertionError(f"{path} never appeared")


async def test_berth_up_runs_the_stack_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "BERTH_STATE_DIR": str(state)}
    up = subprocess.Popen([*BERTH, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        context = _wait_for(state / "context.json", up)
        children = psutil.Process(up.pid).children(recursive=True)
        assert children, "berth up started no services"

        with urllib.request.urlopen(context["temporal_ui_url"], timeout=10) as response:
            assert response.status == 200

        assert stat.S_IMODE((state / "context.json").stat().st_mode) == 0o600  # tokens and the database password
        database = make_url(context["database_url"])
        address = {"host": database.host, "port": database.port, "user": database.username, "database": "berth"}
        with pytest.raises(asyncpg.InvalidPasswordError):  # loopback is every local user's: a password is needed
            await asyncpg.connect(**address)
        connection = await asyncpg.connect(**address, password=database.password)
        try:
            assert await connection.fetchval("SELECT count(*) FROM nodes") == 9
            assert await connection.fetchval("SELECT count(*) FROM tenants") == 2
        finally:
            await connection.close()

        # The example fleet's Kubernetes clusters serve Modelplane's example deployment.
        example = Path(__file__).resolve().parents[2] / "examples" / "modelplane" / "deployment.yaml"
        deployed = subprocess.run(
            [*BERTH, "deploy", "apply", "-f", str(example), "--wait", "--timeout", "60s", "-o", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert deployed.returncode == 0, deployed.stderr
        status = json.loads(deployed.stdout)
        assert (status["available"], status["phase"]) == (3, "FullyScheduled")
        assert sorted(r["cluster"] for r in status["replicas"]) == ["euw1-serve", "use1-serve", "use1-serve"]
        assert len(list((state / "clusters").glob("*/workloads/**/*.json"))) == 3  # namespace ml: workloads/ml/

        again = subprocess.run([*BERTH, "up"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0
        assert f"Berth is already running (pid {up.pid}); reusing it." in again.stdout
        assert context["temporal_address"] in again.stdout
        # The console, served by the API, and how to sign in to it with the tokens this stack made.
        assert f"{context['api_url']}/console/" in again.stdout and "context file" in again.stdout
        with urllib.request.urlopen(f"{context['api_url']}/console/login", timeout=10) as response:
            assert response.status == 200 and b"Sign in to Berth" in response.read()
    finally:
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=60)
    assert up.returncode == 0, output
    assert "stopped." in output
    time.sleep(0.5)
    assert [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []
    assert not (state / "context.json").exists()
