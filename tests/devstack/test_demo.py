"""`berth demo` from a fresh state directory, as a new user runs it: every step as narrated, exit 0, and nothing left
running afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

# Starts processes of its own (a stack, a CLI run): never in the quick tier (tests/tiers.py).
pytestmark = pytest.mark.slow


def test_berth_demo_walks_every_case_and_exits_0(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.process_iter()}
    demo = subprocess.run(
        [sys.executable, "-m", "cli.main", "demo", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = demo.stdout
    assert demo.returncode == 0, output + demo.stderr
    for heading in (
        "Capacity before",
        "1. A slice allocation, active, then released",
        "2. A node whose agent is down is not ranked",
        "3. Cancelled while provisioning",
        "4. A bare-metal host",
        "5. A request that cannot be placed, and why",
        "Capacity after",
        "6. Waiting for capacity instead of failing",
        "7. A ModelDeployment: spread over clusters, scaled past capacity, deleted",
        "8. What each tenant used: the usage ledger",
    ):
        assert heading in output
    assert "explain: j22u11 agent_down" in output and "attempt on j22u11" not in output
    assert "POST /v1/allocations: 422 unsatisfiable: no gpu_slice host has 16 H200 GPUs" in output
    assert output.count("  Temporal UI: http://127.0.0.1:") == 7  # one per allocation created, one for the deployment
    assert "  queued in us-east, position 1: " in output and "the queued request woke and is active on" in output
    assert "PartiallyScheduled: 3 of 9 replicas scheduled" in output
    assert "usage " in output and "GPU-HOURS" in output and "namespace:default" in output  # replicas' node-hours
    assert "not as narrated" not in output
    assert "Every step behaved as narrated" in output
    assert "See it all in the console: run `berth up`" in output  # its own stack is gone: where to look next
    leftovers = [
        p
        for p in psutil.process_iter(["pid", "cmdline"])
        if p.pid not in before and p.info["cmdline"] and str(tmp_path) in " ".join(p.info["cmdline"])
    ]
    assert leftovers == []
