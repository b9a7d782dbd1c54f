"""What a new user reaches for and must not be caught out by, run as they run it next to `berth up` (the context file
only, the real API, PostgreSQL and Temporal; tests/cli/test_cli_api.py's terminal): durations that need a unit,
honest answers about what a tenant may use, node statuses that say what a node does, kubectl's conventions (`-o
yaml`, `-o wide`, `--version`, `--wait`, errors as JSON, one case of headers, times as `date -d` takes them), a
context file found from anywhere in the project, and capacity numbers that name themselves.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

import cli
from cli import output
from cli.main import app
from tests.api.stack import api_fleet
from tests.cli.test_cli_api import UNSET, Terminal, one_error_line, open_terminal
from tests.workflows.lab import lab_fleet

runner = CliRunner()
NO_UNIT = "has no unit: write 5s, 5m or 5h"


@pytest.fixture
def terminal(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Terminal]:
    with open_terminal(database_url, temporal_env, tmp_path, api_fleet()) as opened:
        yield opened


def _created_id(result: Any) -> str:
    assert result.exit_code == 0, result.output
    return str(result.stdout.split("Allocation ", 1)[1].split()[0])


# Durations --------------------------------------------------------------------------------------------------------


def test_a_duration_without_a_unit_is_refused_by_every_flag_and_by_the_api(terminal: Terminal) -> None:
    for args, flag in (
        (["alloc", "create", "--gpus", "1", "--duration", "5"], "--duration"),
        (["alloc", "create", "--gpus", "1", "--queue-timeout", "5"], "--queue-timeout"),
        (["alloc", "create", "--gpus", "1", "--wait", "--timeout", "5"], "--timeout"),
        (
            ["reservations", "create", "--gpus", "1", "--region", "lab", "--start", "+1h", "--duration", "5"],
            "--duration",
        ),
        (["alloc", "extend", "any", "--by", "5"], "--by"),
    ):
        line = one_error_line(terminal.berth(*args))
        assert line.startswith(f"error: {flag} '5' {NO_UNIT} (a duration is a number and its unit"), line
    assert terminal.json("alloc", "list")["allocations"] == []  # nothing was created: no five-second lease

    # The API refuses the same, a JSON number and a string alike, naming the field: a 422 with a code.
    api, acme = terminal.served.base_url, {"Authorization": f"Bearer {terminal.served.tenant_tokens['acme']}"}
    for body, field in (
        ({"gpu_count": 1, "duration": 5}, "body.duration"),
        ({"gpu_count": 1, "duration": "5"}, "body.duration"),
        ({"gpu_count": 1, "queue": {"timeout": 30}}, "body.queue.timeout"),
    ):
        answer = httpx.post(f"{api}/v1/allocations", json=body, headers=acme)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid_request" and [d["field"] for d in error["details"]] == [field]
        assert error["message"].startswith(f"the request is not valid: {field}: ") and "has no unit" in error["message"]
    window = {
        "gpu_count": 1,
        "region": "lab",
        "starts_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
        "duration": "90",
    }
    refused = httpx.post(f"{api}/v1/reservations", json=window, headers=acme).json()["error"]
    assert refused["details"][0]["field"] == "body.duration" and "'90' has no unit" in refused["message"]

    # With its unit it is what it says: two hours.
    created = terminal.json("alloc", "create", "--gpus", "2", "--duration", "2h")
    active = terminal.wait_for(created["id"], "active")
    held = datetime.fromisoformat(active["ends_at"]) - datetime.now(UTC)
    assert timedelta(hours=1, minutes=55) < held <= timedelta(hours=2)


# What a tenant may use --------------------------------------------------------------------------------------------


def _two_regions() -> str:
    """The lab fleet's region `lab` (H200 hosts) and region `east` (an L4 pool, node e1); globex may use east only."""
    documents = list(yaml.safe_load_all(api_fleet()))
    for document in documents:
        if document["kind"] == "Tenant" and document["metadata"]["name"] == "globex":
            document["spec"]["allowedRegions"] = ["east"]
    [east] = [d for d in yaml.safe_load_all(lab_fleet({"e1": {"gpus": 2}})) if d["kind"] == "InferenceCluster"]
    east["metadata"]["name"], east["spec"]["region"] = "east-1", "east"
    east["spec"]["nodePools"][0]["gpuProduct"] = "L4"
    for slot in east["spec"]["nodePools"][0]["nodes"][0]["slots"]:
        slot["mac"], slot["privateIp"] = f"52:54:00:ee:00:{slot['index']:02x}", f"10.9.0.{10 + slot['index']}"
    region = {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "Region",
        "metadata": {"name": "east"},
        "spec": {"prices": {"L4": 1.0}},
    }
    return yaml.safe_dump_all([*documents, east, region], sort_keys=False)


def test_a_tenant_is_told_what_is_not_in_its_regions_without_learning_the_rest(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with open_terminal(database_url, temporal_env, tmp_path, _two_regions()) as terminal:
        h200 = terminal.berth("explain", "--gpus", "2", "--product", "H200", "--tenant", "globex")
        assert one_error_line(h200) == (
            "error: no H200 in the regions your tenant may use; available to you: L4 (unknown_product, HTTP 422)"
        )
        # A product that exists nowhere reads the same: the answer tells nothing of the regions it may not use.
        nowhere = terminal.berth("alloc", "create", "--gpus", "2", "--product", "B200", "--tenant", "globex")
        assert "no B200 in the regions your tenant may use; available to you: L4" in one_error_line(nowhere)
        # An admin sees the whole fleet: H200 exists, and explain says why globex cannot have it.
        refused = terminal.json(
            "explain", "--gpus", "2", "--product", "H200", "--token", terminal.served.admin_token, "--tenant", "globex"
        )
        assert refused["placed"] is False
        unknown = terminal.berth("explain", "--gpus", "1", "--product", "B200")
        assert "product 'B200' does not exist in the fleet; choose one of: H200, L4" in one_error_line(unknown)


# Node statuses ----------------------------------------------------------------------------------------------------


def test_node_statuses_say_what_each_node_is_doing(terminal: Terminal, tmp_path: Path) -> None:
    allocation_id = terminal.json("alloc", "create", "--gpus", "4")["id"]  # on big
    terminal.wait_for(allocation_id, "active")
    drained = terminal.ok("nodes", "drain", "big")
    assert drained.startswith("node big is DRAINING (fleet: READY); told 1 allocation(s)"), drained
    assert [n["name"] for n in terminal.json("nodes", "list", "--status", "DRAINING")["nodes"]] == ["big"]
    assert terminal.json("nodes", "list", "--status", "CORDONED")["nodes"] == []
    assert terminal.json("nodes", "cordon", "big")["status"] == "DRAINING"  # already takes nothing new
    assert terminal.json("nodes", "uncordon", "big")["status"] == "READY"

    # A node whose agent never reported takes no work: it is not READY, whatever the fleet file says.
    documents = list(yaml.safe_load_all(api_fleet()))
    cluster = next(d for d in documents if d["kind"] == "InferenceCluster")
    cluster["spec"]["nodePools"][0]["nodes"].append(
        {
            "name": "quiet",
            "numaNodes": 1,
            "slots": [
                {
                    "index": 0,
                    "gpuPci": "0000:10:00.0",
                    "fabricParentPci": "0000:40:00.0",
                    "fabricVfPci": "0000:40:00.2",
                    "fabricClaimMode": "per_slot_vf",
                    "mac": "52:54:00:99:00:00",
                    "privateIp": "10.0.99.10",
                }
            ],
        }
    )
    fleet = tmp_path / "with-quiet.yaml"
    fleet.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    terminal.ok("apply", "-f", str(fleet))
    quiet = terminal.json("nodes", "get", "quiet")
    state = (quiet["status"], quiet["declared_status"], quiet["agent"]["state"])
    assert state == ("NOT_READY", "READY", "never_reported")
    assert [n["name"] for n in terminal.json("nodes", "list", "--status", "NOT_READY")["nodes"]] == ["quiet"]
    assert "quiet" not in [n["name"] for n in terminal.json("nodes", "list", "--status", "READY")["nodes"]]
    listed = terminal.ok("nodes", "list", "-o", "wide")  # wide: every row on one line
    assert re.search(
        r"│ quiet +│ lab-1/slices │ lab +│ gpu_slice │ H200 +│ NOT_READY \(fleet: READY\) │ never_reported",
        listed,
    )


# kubectl's conventions --------------------------------------------------------------------------------------------


def test_yaml_output_is_the_json_answer_and_errors_are_json_under_a_data_format(terminal: Terminal) -> None:
    created = terminal.json("alloc", "create", "--gpus", "2")
    assert yaml.safe_load(terminal.ok("alloc", "get", created["id"], "-o", "yaml"))["id"] == created["id"]
    nodes = yaml.safe_load(terminal.ok("nodes", "list", "-o", "yaml"))["nodes"]
    assert [(n["name"], n["status"]) for n in nodes] == [("big", "READY"), ("slow", "READY"), ("small", "READY")]

    missing = terminal.berth("alloc", "get", "nosuch", "-o", "json")
    assert (missing.exit_code, missing.stdout) == (1, "")
    assert json.loads(missing.stderr) == {
        "error": {
            "code": "not_found",
            "message": "allocation 'nosuch' does not exist",
            "status": 404,
            "details": {"kind": "allocation", "name": "nosuch"},
        }
    }
    bad = terminal.berth("alloc", "create", "--gpus", "1", "--duration", "5", "-o", "yaml")
    error = json.loads(bad.stderr)["error"]
    assert bad.exit_code == 1 and error["code"] == "invalid_argument" and error["message"].startswith("--duration '5'")
    assert "error: allocation 'nosuch' does not exist (not_found, HTTP 404)" == one_error_line(
        terminal.berth("alloc", "get", "nosuch")
    )  # text stays one line


def test_names_are_never_cut_and_wide_shows_everything(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output.console, "width", 100)  # a terminal 100 columns wide
    hosts = {"use1-h200-node-0001": {"gpus": 1}, "use1-h200-node-0002": {"gpus": 1}}
    with open_terminal(database_url, temporal_env, tmp_path, lab_fleet(hosts)) as terminal:
        listed = terminal.ok("nodes", "list")
        assert max(len(line) for line in listed.splitlines()) <= 100
        assert "use1-h200-node-0001" in listed and "use1-h200-node-0002" in listed  # whole, each on one line
        assert "AGENT VERSION" not in listed

        wide = terminal.ok("nodes", "list", "-o", "wide")
        header = next(line for line in wide.splitlines() if "NODE" in line)
        assert "AGENT VERSION" in header and "LABELS" in header and len(header) > 100  # nothing cut to fit
        row = next(line for line in wide.splitlines() if "use1-h200-node-0001" in line)
        assert re.search(r"│ use1-h200-node-0001 │ lab-1/slices │ lab +│ gpu_slice │ H200 +│ READY +│", row), row


def test_table_headers_are_capitals_everywhere(terminal: Terminal) -> None:
    terminal.json("alloc", "create", "--gpus", "2")
    for args, headers in (
        (["alloc", "list"], ["ID", "TENANT", "STATE", "REQUEST", "REGION", "POOL", "NODE", "CREATED"]),
        (["nodes", "list"], ["NODE", "POOL", "REGION", "SHAPE", "PRODUCT", "STATUS", "AGENT"]),
        (["capacity"], ["POOL", "REGION", "SHAPE", "PRODUCT", "READY NODES"]),
        (["explain", "--gpus", "1"], ["LEVEL", "IN", "OUT"]),
    ):
        header = next(line for line in terminal.ok(*args).splitlines() if line.startswith("┃"))
        cells = [cell.strip() for cell in header.strip("┃").split("┃")]
        assert cells[: len(headers)] == headers, header


def test_every_table_of_the_cli_is_drawn_by_one_mechanism() -> None:
    """`cli.output.table` writes headers in capitals and keeps names whole; a Rich `Table(...)` made anywhere else
    would not (a `Table.grid` of label and value has no headers)."""
    package = Path(cli.__file__).parent
    made = {
        path.name: node.lineno
        for path in sorted(package.glob("*.py"))
        if path.name != "output.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Table"
    }
    assert made == {}


def test_version(terminal: Terminal) -> None:
    shown = terminal.berth("--version")
    assert (shown.exit_code, shown.stdout) == (0, f"berth {metadata.version('berth')}\n")


def test_release_and_cancel_wait_until_the_allocation_has_ended(terminal: Terminal) -> None:
    active = _created_id(terminal.berth("alloc", "create", "--gpus", "2", "--wait"))  # on small
    released = terminal.berth("alloc", "release", active, "--wait")
    assert released.exit_code == 0, released.output
    assert f"Releasing allocation {active}; waiting until it has ended" in released.stdout
    assert re.search(r"^State +released", released.stdout, re.M), released.stdout
    assert terminal.json("alloc", "get", active)["state"] == "released"  # read at once: no polling in the script

    stuck = terminal.json("alloc", "create", "--gpus", "1")["id"]  # on slow, which never boots
    terminal.wait_for(stuck, "waiting_ready")
    cancelled = terminal.berth("alloc", "cancel", stuck, "--wait", "--timeout", "2m", "-o", "json")
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["state"] == "cancelled"


def test_times_are_read_as_date_d_users_write_them(terminal: Terminal) -> None:
    before = datetime.now(UTC)
    made = terminal.json(
        "reservations", "create", "--gpus", "1", "--region", "lab", "--start", "tomorrow", "--duration", "1h"
    )
    starts = datetime.fromisoformat(made["starts_at"])
    assert before + timedelta(hours=24) <= starts <= datetime.now(UTC) + timedelta(hours=24)
    assert datetime.fromisoformat(made["ends_at"]) - starts == timedelta(hours=1)
    soon = terminal.json(
        "reservations", "create", "--gpus", "1", "--region", "lab", "--start", "now+2h", "--end", "+3h"
    )
    assert timedelta(hours=1) <= datetime.fromisoformat(soon["ends_at"]) - datetime.fromisoformat(soon["starts_at"])

    line = one_error_line(
        terminal.berth(
            "reservations", "create", "--gpus", "1", "--region", "lab", "--start", "next tuesday", "--duration", "1h"
        )
    )
    assert line.startswith("error: --start 'next tuesday' is not a time: write an ISO 8601 time (2026-12-01T09:00:00Z")
    assert "now, today, tomorrow or yesterday" in line and "now+DURATION" in line
    at = one_error_line(terminal.berth("capacity", "--at", "soonish"))
    assert at.startswith("error: --at 'soonish' is not a time")


# Where the context is found ---------------------------------------------------------------------------------------


def test_the_context_is_found_where_kubectl_users_look(
    terminal: Terminal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = (terminal.state_dir / "context.json").read_text()
    project = tmp_path / "project"
    (project / ".berth").mkdir(parents=True)
    (project / ".berth" / "context.json").write_text(written)
    deep = project / "services" / "inference"
    deep.mkdir(parents=True)
    config = tmp_path / "config"
    env = {**UNSET, "BERTH_CONTEXT": None, "BERTH_STATE_DIR": None, "XDG_CONFIG_HOME": str(config)}

    def berth(*args: str, **more: str | None) -> Any:
        return runner.invoke(app, list(args), env={**env, **more})

    monkeypatch.chdir(deep)  # a shell two directories below the project's root
    shown = berth("context")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith(f"context {project / '.berth' / 'context.json'} (in a parent directory)")
    assert re.search(rf"^API +{terminal.served.base_url} *$", shown.stdout, re.M)
    assert re.search(r"^Tokens +admin, acme, globex *$", shown.stdout, re.M), shown.stdout
    assert berth("capacity", "-o", "json").exit_code == 0  # every command finds it there

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    nothing = one_error_line(berth("context"))
    assert nothing.startswith(
        f"error: no context file: looked for .berth/context.json in {elsewhere} and its parents, "
        f"{config / 'berth' / 'context.json'}"
    )
    (config / "berth").mkdir(parents=True)
    (config / "berth" / "context.json").write_text(written)
    described = json.loads(berth("context", "-o", "json").stdout)
    assert (described["path"], described["source"]) == (
        str(config / "berth" / "context.json"),
        "the user's config directory",
    )
    assert described["api_url"] == terminal.served.base_url and "admin_token" in described
    assert terminal.served.admin_token not in json.dumps(described)  # tokens are never shown

    named = tmp_path / "named.json"
    named.write_text(written)
    chosen = berth("context", BERTH_CONTEXT=str(named))
    assert chosen.stdout.startswith(f"context {named} (named by BERTH_CONTEXT)")
    missing = one_error_line(berth("capacity", BERTH_CONTEXT=str(tmp_path / "none.json")))
    assert f"looked for {tmp_path / 'none.json'} (BERTH_CONTEXT)" in missing


# Capacity's numbers -----------------------------------------------------------------------------------------------


def test_capacity_and_nodes_name_the_numbers_they_show(terminal: Terminal) -> None:
    for args, row in (
        (["capacity"], r"│ lab-1/slices │ lab +│ gpu_slice │ H200 +│ +3/3 │ +0 │ +7 │ +7 │ +7 │"),
        (
            ["nodes", "list"],
            r"│ big +│ lab-1/slices │ lab +│ gpu_slice │ H200 +│ READY +│ live [0-9:]+ │ +4 │ +4 │ +4 │",
        ),
    ):
        shown = terminal.ok(*args)
        header = next(line for line in shown.splitlines() if line.startswith("┃"))
        assert "┃ VALIDATED GPUS ┃ VALID SLICE BUNDLES ┃" in header, header
        assert re.search(row, shown) and "7/7" not in shown and "4/4" not in shown, shown
