"""`berth deploy -n`: namespaced ModelDeployments as a person runs them against the real API (uvicorn, a control
worker, simulated clusters `east` with 2 nodes and `west` with 1)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.cli.test_cli_api import Terminal, one_error_line, open_terminal
from tests.cli.test_deploy_cli import write
from tests.workflows.deployment_lab import deployment, k8s_fleet


@pytest.fixture
def terminal(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Terminal]:
    with open_terminal(database_url, temporal_env, tmp_path, k8s_fleet({"east": 2, "west": 1})) as opened:
        yield opened


def _gone(terminal: Terminal, *args: str) -> None:
    deadline = time.monotonic() + 30
    while terminal.berth("deploy", "get", *args).exit_code == 0:
        assert time.monotonic() < deadline, args
        time.sleep(0.2)


def test_namespace_from_the_manifest_or_the_option(terminal: Terminal, tmp_path: Path) -> None:
    manifest = deployment("ns-llama", 1)
    manifest["metadata"]["namespace"] = "prod"
    applied = terminal.ok("deploy", "apply", "-f", write(tmp_path, "prod.yaml", manifest), "--wait", "--timeout", "60s")
    assert "Created deployment prod/ns-llama." in applied and "1 available" in applied
    # -n puts a manifest without a namespace into that namespace; the default namespace is another deployment.
    plain = write(tmp_path, "plain.yaml", deployment("ns-llama", 1))
    answer = terminal.json("deploy", "apply", "-f", plain, "-n", "staging")
    assert answer == {"name": "ns-llama", "created": True, "workflow_id": "deployment/staging/ns-llama"}
    assert terminal.json("deploy", "apply", "-f", plain)["workflow_id"] == "deployment/ns-llama"

    view = terminal.json("deploy", "get", "ns-llama", "-n", "prod")
    assert (view["namespace"], view["available"], view["workflow_id"]) == ("prod", 1, "deployment/prod/ns-llama")
    assert "prod/ns-llama" in terminal.ok("deploy", "get", "ns-llama", "--namespace", "prod")
    listed = terminal.json("deploy", "list")["deployments"]
    assert sorted((d["namespace"], d["name"]) for d in listed) == [
        ("default", "ns-llama"),
        ("prod", "ns-llama"),
        ("staging", "ns-llama"),
    ]
    assert [d["namespace"] for d in terminal.json("deploy", "list", "-n", "prod")["deployments"]] == ["prod"]
    table = terminal.ok("deploy", "list")
    assert "NAMESPACE" in table and "staging" in table

    # A manifest naming another namespace than -n is refused by the API, naming the field.
    line = one_error_line(terminal.berth("deploy", "apply", "-f", write(tmp_path, "p.yaml", manifest), "-n", "dev"))
    assert "metadata.namespace" in line and "HTTP 422" in line
    assert "HTTP 404" in one_error_line(terminal.berth("deploy", "get", "ns-llama", "-n", "dev"))

    assert "Deleting deployment prod/ns-llama" in terminal.ok("deploy", "delete", "ns-llama", "-n", "prod")
    _gone(terminal, "ns-llama", "-n", "prod")
    assert terminal.json("deploy", "get", "ns-llama")["namespace"] == "default"  # untouched
    for args in (("ns-llama", "-n", "staging"), ("ns-llama",)):
        terminal.ok("deploy", "delete", *args)
        _gone(terminal, *args)
