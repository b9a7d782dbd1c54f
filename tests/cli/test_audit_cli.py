"""`berth audit` as an operator runs it next to `berth up`: no flags, the real API over HTTP, real agents (the lab
fleet of tests/api/stack.py: hosts slow, small, big). A VM planted by hand on `big` is the drift."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from agent.drivers import VmRecord
from tests.api.stack import api_fleet
from tests.cli.test_cli_api import Terminal, one_error_line, open_terminal


@pytest.fixture
def terminal(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Terminal]:
    with open_terminal(database_url, temporal_env, tmp_path, api_fleet()) as opened:
        yield opened


def test_audit_shows_the_drift_and_repair_heals_it(terminal: Terminal, tmp_path: Path) -> None:
    assert "no audit has finished yet" in terminal.ok("audit", "--last")
    vm = tmp_path / "lab" / "nodes" / "big" / "vms" / "stray.json"
    vm.write_text(
        VmRecord(
            vm_id="vm-stray", allocation_id="stray", slot_indexes=[2], created_at=datetime.now(UTC).timestamp()
        ).model_dump_json()
    )

    shown = terminal.ok("audit")
    assert "3 host(s) checked" in shown
    assert "orphan_vm" in shown and "stray" in shown and "(not repaired now: grace period" in shown
    assert "VM vm-stray on big (allocation stray, slots [2]) is accounted for by no active claim" in shown

    repaired = terminal.json("audit", "--repair")
    assert [(r["kind"], r["outcome"]) for r in repaired["report"]["repairs"]] == [("orphan_vm", "done")]
    assert not vm.exists()
    assert "destroyed the VM of stray on big" in terminal.ok("audit", "--last")
    assert "no drift" in terminal.ok("audit")


def test_audit_errors_are_one_line(terminal: Terminal) -> None:
    tenant = terminal.served.tenant_tokens["acme"]
    refused = terminal.berth("audit", "--token", tenant, "--api", terminal.served.base_url)
    assert "this needs the operator role" in one_error_line(refused)
    assert one_error_line(refused).endswith("(forbidden, HTTP 403)")
    assert "pick one" in one_error_line(terminal.berth("audit", "--repair", "--last"))
