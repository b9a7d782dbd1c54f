"""`berth deploy` as a person runs it next to `berth up`: only the context file, against the real API served by
uvicorn with a control worker (simulated clusters `east` with 2 nodes and `west` with 1)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.testing import WorkflowEnvironment

from cli.main import app
from tests.cli.test_cli_api import Terminal, one_error_line, open_terminal, runner
from tests.workflows.deployment_lab import deployment, k8s_fleet


@pytest.fixture
def terminal(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Terminal]:
    with open_terminal(database_url, temporal_env, tmp_path, k8s_fleet({"east": 2, "west": 1})) as opened:
        yield opened


def write(tmp_path: Path, name: str, *documents: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return str(path)


def test_apply_get_list_delete_in_text_and_json(terminal: Terminal, tmp_path: Path) -> None:
    file = write(tmp_path, "llama.yaml", deployment("llama", 2))
    applied = terminal.ok("deploy", "apply", "-f", file, "--wait", "--timeout", "60s")
    assert "Created deployment llama." in applied
    assert "2 available, 2 scheduled, 2 desired" in applied and "FullyScheduled" in applied
    assert "llama-east-0" in applied and "serve: serve" in applied and "ready" in applied

    more = write(tmp_path, "more.yaml", deployment("llama", 4, min_replicas=1))
    answer = terminal.json("deploy", "apply", "-f", more)
    assert answer == {"name": "llama", "created": False, "workflow_id": "deployment/llama"}
    deadline = time.monotonic() + 30
    while (view := terminal.json("deploy", "get", "llama"))["available"] != 3:
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    assert view["phase"] == "PartiallyScheduled" and view["message"].startswith("3 of 4 replicas scheduled")
    text = terminal.ok("deploy", "get", "llama")
    assert "Why not more" in text and "InsufficientNodes" in text

    listed = terminal.json("deploy", "list")["deployments"]
    assert [(d["name"], d["desired"]) for d in listed] == [("llama", 4)]
    assert "llama" in terminal.ok("deploy", "list")

    assert "Deleting deployment llama" in terminal.ok("deploy", "delete", "llama")
    deadline = time.monotonic() + 30
    while terminal.berth("deploy", "get", "llama").exit_code == 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "deployment 'llama' does not exist (not_found, HTTP 404)" in one_error_line(
        terminal.berth("deploy", "get", "llama")
    )
    assert json.loads(terminal.ok("deploy", "list", "-o", "json")) == {"deployments": [], "next_cursor": None}


def test_errors_are_one_line(terminal: Terminal, tmp_path: Path) -> None:
    bad = deployment("llama", 1)
    bad["spec"]["replicas"] = "many"
    line = one_error_line(terminal.berth("deploy", "apply", "-f", write(tmp_path, "bad.yaml", bad)))
    assert "spec.replicas" in line and "HTTP 422" in line
    region = {"apiVersion": "berth.dev/v1alpha1", "kind": "Region", "metadata": {"name": "x"}, "spec": {}}
    line = one_error_line(terminal.berth("deploy", "apply", "-f", write(tmp_path, "region.yaml", region)))
    assert "document 1 is Region, not a ModelDeployment" in line
    assert "cannot read it" in one_error_line(terminal.berth("deploy", "apply", "-f", str(tmp_path / "missing.yaml")))
    assert "HTTP 404" in one_error_line(terminal.berth("deploy", "delete", "nope"))


def test_berth_apply_tells_running_deployments_to_replan(terminal: Terminal, tmp_path: Path) -> None:
    """A fleet change made with `berth apply` reaches running deployments at once, as `PUT /v1/fleet` does."""
    file = write(tmp_path, "regrow.yaml", deployment("regrow", 4))
    terminal.ok("deploy", "apply", "-f", file, "--wait", "--timeout", "60s")
    assert terminal.json("deploy", "get", "regrow")["available"] == 3  # east 2 + west 1 nodes

    env = {**terminal.env, "BERTH_CONTROL_TASK_QUEUE": terminal.served.control_queue}
    # A change no placement reads (a new tenant) walks the queues but re-plans no deployment, as PUT /v1/fleet does.
    tenant = tmp_path / "tenant.yaml"
    tenant.write_text("apiVersion: berth.dev/v1alpha1\nkind: Tenant\nmetadata: {name: newcomer}\nspec: {gpuQuota: 1}\n")
    quiet = runner.invoke(app, ["apply", "-f", str(tenant), "-o", "json"], env=env)
    assert quiet.exit_code == 0, quiet.output
    assert json.loads(quiet.output)["deployments_told"] == 0

    grown = tmp_path / "grown.yaml"
    grown.write_text(k8s_fleet({"east": 2, "west": 2}))
    applied = runner.invoke(app, ["apply", "-f", str(grown)], env=env)
    assert applied.exit_code == 0, applied.output
    assert "told 1 running deployment(s) to re-plan" in applied.output
    deadline = time.monotonic() + 30  # well before the deployment's own resync
    while (view := terminal.json("deploy", "get", "regrow"))["available"] != 4:
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    assert view["phase"] == "FullyScheduled"

    # Deployments outlive the test's workers on the shared Temporal server: leave none running.
    terminal.ok("deploy", "delete", "regrow")
    deadline = time.monotonic() + 30
    while terminal.berth("deploy", "get", "regrow").exit_code == 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
