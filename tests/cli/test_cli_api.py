"""The `berth` commands that talk to the API, run as a person runs them in a second terminal next to `berth up`: no
flags, only the context file, against the real API served by uvicorn with a control worker and node agents.

The stack (tests/api/served.py) runs on its own thread and event loop, so the commands are invoked directly from
plain test functions. The lab fleet (tests/api/stack.py): hosts `slow` (1 GPU, never boots), `small` (2) and `big`
(4) in pool lab-1/slices of region `lab`; tenants `acme` and `globex` (quota 2).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import Result
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from cli.main import app
from config.context import StackContext, write_context
from config.settings import Settings
from tests.api.served import Served, served_api
from tests.api.stack import api_fleet

runner = CliRunner()
UNSET = {"BERTH_API_URL": None, "BERTH_TOKEN": None, "BERTH_DATABASE_URL": None, "COLUMNS": "200"}


class Terminal:
    """A shell whose only configuration is the context file `berth up` wrote."""

    def __init__(self, served: Served, state_dir: Path, env: dict[str, str | None]) -> None:
        self.served = served
        self.state_dir = state_dir
        self.env = env

    def berth(self, *args: str) -> Result:
        return runner.invoke(app, list(args), env=self.env)

    def ok(self, *args: str) -> str:
        result = self.berth(*args)
        assert result.exit_code == 0, result.output
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "-o", "json"))

    def wait_for(self, allocation_id: str, *states: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (allocation := self.json("alloc", "get", allocation_id))["state"] not in states:
            assert time.monotonic() < deadline, f"{allocation_id} stayed {allocation['state']} (wanted {states})"
            time.sleep(0.1)
        return allocation


def one_error_line(result: Result) -> str:
    """The command failed as a person should see it: exit 1 and a single `error:` line, no traceback."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@contextlib.contextmanager
def open_terminal(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path, fleet: str
) -> Iterator[Terminal]:
    """The API served over `fleet` with a control worker, and a terminal whose only configuration is the context
    file `berth up` would write."""
    client = temporal_env.client
    target = client.service_client.config.target_host
    with served_api(database_url, target, client.namespace, fleet, tmp_path / "lab") as served:
        deadline = time.monotonic() + 10
        while httpx.get(f"{served.base_url}/healthz").json()["control_workers"] == 0:
            assert time.monotonic() < deadline, "the control worker never polled"
            time.sleep(0.05)
        settings = Settings(state_dir=tmp_path / "state")
        context = StackContext(
            api_url=served.base_url,
            temporal_address=target,
            database_url=database_url,
            admin_token=served.admin_token,
            tenant_tokens=served.tenant_tokens,
            temporal_ui_url="http://127.0.0.1:8233",
        )
        write_context(settings, context)
        yield Terminal(served, settings.state_dir, {**UNSET, "BERTH_STATE_DIR": str(settings.state_dir)})


@pytest.fixture
def terminal(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Terminal]:
    with open_terminal(database_url, temporal_env, tmp_path, api_fleet()) as opened:
        yield opened


def test_create_wait_get_list_and_release_with_no_flags(terminal: Terminal) -> None:
    created = terminal.berth("alloc", "create", "--gpus", "2", "--wait")
    assert created.exit_code == 0, created.output
    assert "acting for tenant acme" in created.stderr  # the admin token must name a tenant: the first one
    assert "active on small" in created.stdout
    allocation_id = created.stdout.split("Allocation ", 1)[1].split()[0]
    assert "│ 1 │ small │ succeeded │" in created.stdout  # the attempts
    assert re.search(r"│ active +│ ready +│ +│ 1 +│ small +│", created.stdout)  # the timeline's last step

    listed = terminal.ok("alloc", "list")
    assert allocation_id in listed and "lab-1/slices" in listed and "2 GPUs, gpu_slice" in listed
    assert [a["id"] for a in terminal.json("alloc", "list", "--state", "active")["allocations"]] == [allocation_id]
    assert terminal.json("alloc", "list", "--node", "big")["allocations"] == []

    detail = terminal.json("alloc", "get", allocation_id)
    assert (detail["tenant"], detail["state"], detail["node"]) == ("acme", "active", "small")
    assert [b["slot_id"] for b in detail["bundles"]] == ["small/0", "small/1"]
    text = terminal.ok("alloc", "get", allocation_id)
    assert "Timeline" in text and "wait_ready" in text and "small/1" in text
    asked_by = detail["requested_by"]  # the tenant's token of `berth up`'s context: a service account
    assert asked_by.startswith("token:") and f"Asked by     {asked_by}" in text
    # The allocation's page in the Temporal UI: the workflow id's current run, which tells the whole story.
    assert f"http://127.0.0.1:8233/namespaces/default/workflows/allocation%2F{allocation_id}" in text

    assert f"Releasing allocation {allocation_id}" in terminal.ok("alloc", "release", allocation_id)
    released = terminal.wait_for(allocation_id, "released")
    last = released["events"][-3:]
    assert [e["step"] for e in last] == ["release_requested", "release", "released"]
    assert last[0]["actor"].startswith("token:") and [e["actor"] for e in last[1:]] == [None, None]
    assert "released" in terminal.ok("alloc", "get", allocation_id)


def test_usage_reports_what_was_held_as_a_table_json_and_csv(terminal: Terminal) -> None:
    created = terminal.berth("alloc", "create", "--gpus", "2", "--wait")  # on `small` (`slow` never boots)
    assert created.exit_code == 0, created.output
    allocation_id = created.stdout.split("Allocation ", 1)[1].split()[0]
    terminal.ok("alloc", "release", allocation_id)
    terminal.wait_for(allocation_id, "released")

    report = terminal.json("usage", "--by", "tenant,pool")
    acme = next(row for row in report["rows"] if row["tenant"] == "acme")
    assert acme["pool"] == "lab-1/slices" and acme["gpu_hours"] > 0 and acme["allocations"] >= 1
    table = terminal.ok("usage", "--by", "tenant,pool")
    assert "usage" in table and "acme" in table and "lab-1/slices" in table and "GPU-HOURS" in table
    lines = terminal.ok("usage", "--by", "tenant,pool", "-o", "csv").splitlines()
    assert lines[0] == "tenant,pool,gpu_hours,allocations,peak_gpus,share_of_fleet,reserved_gpu_hours,node_hours"
    assert any(line.startswith("acme,lab-1/slices,") for line in lines[1:]), lines


def test_create_json_sends_every_field_under_an_idempotency_key(terminal: Terminal, tmp_path: Path) -> None:
    key_file = tmp_path / "id_ed25519.pub"
    key_file.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE5pYmJsZQ== me@laptop\n")
    args = [
        "alloc",
        "create",
        "--gpus",
        "4",
        "--tenant",
        "acme",
        "--product",
        "H200",
        "--region",
        "lab",
        "--image",
        "ubuntu-24.04",
        "--ssh-key",
        str(key_file),
        "--label",
        "team=ml",
        "--idempotency-key",
        "k1",
    ]
    first = terminal.json(*args)
    # Its state when the API wrote its row: `pending`, or further on if its workflow wrote the row first.
    assert first["state"] not in ("failed", "cancelled") and first["workflow_id"] == f"allocation/{first['id']}"
    assert terminal.json(*args)["id"] == first["id"]  # same key, same body: the same allocation
    detail = terminal.wait_for(first["id"], "active")
    assert (detail["gpu_product"], detail["region"], detail["node"]) == ("H200", "lab", "big")

    # The label is part of the body the key was first used with: changing it is a conflict, not a new allocation.
    changed = terminal.berth(*[("team=infra" if arg == "team=ml" else arg) for arg in args])
    assert "was already used for allocation" in one_error_line(changed)
    assert "(idempotency_conflict, HTTP 409)" in changed.stderr


def test_wait_on_an_allocation_that_fails_exits_1_with_its_reason_and_retry_places_it_again(
    terminal: Terminal,
) -> None:
    # Over the tenant's quota is refused at create: one line, and no allocation to follow.
    over = terminal.berth("alloc", "create", "--gpus", "4", "--tenant", "globex", "--wait")
    line = one_error_line(over)
    assert "tenant globex would exceed its GPU quota" in line and "4 requested > quota 2" in line
    assert "(quota_exceeded, HTTP 409)" in line

    for node in ("slow", "small", "big"):  # nothing can take it now, though `big` could once uncordoned
        terminal.ok("nodes", "cordon", node)
    failed = terminal.berth("alloc", "create", "--gpus", "4", "--wait")
    line = one_error_line(failed)
    assert "failed: insufficient_capacity" in line
    assert "Failure" in failed.stdout
    allocation_id = line.split("allocation ", 1)[1].split()[0]

    retried = terminal.json("alloc", "retry", allocation_id)
    assert (retried["id"], retried["state"]) == (allocation_id, "pending")
    again = terminal.wait_for(allocation_id, "failed")
    states = [e["state"] for e in again["events"] if e["actor"] is None]  # the workflow's own steps
    assert [e["step"] for e in again["events"] if e["actor"]] == ["retry_requested"]  # the admin's, by the CLI
    assert states.count("failed") == 2 and "placing" in states[states.index("failed") :]  # a second run

    wait_json = terminal.berth("alloc", "create", "--gpus", "4", "--wait", "-o", "json")
    assert json.loads(wait_json.stdout)["failure_reason"].startswith("insufficient_capacity")
    assert (
        wait_json.exit_code == 1 and "failed: insufficient_capacity" in json.loads(wait_json.stderr)["error"]["message"]
    )


def test_retry_excluding_a_node_then_cancel(terminal: Terminal) -> None:
    timed_out = terminal.berth("alloc", "create", "--gpus", "1", "--wait", "--timeout", "1s")
    line = one_error_line(timed_out)
    assert " after 1s; follow it with `berth alloc get " in line and "is still " in line
    allocation_id = line.split()[2]  # error: allocation ID is still ...
    stuck = terminal.wait_for(allocation_id, "waiting_ready")
    assert stuck["node"] == "slow"  # best fit; that host never boots

    assert f"Retrying allocation {allocation_id}" in terminal.ok("alloc", "retry", allocation_id, "--exclude", "slow")
    moved = terminal.wait_for(allocation_id, "active")
    assert [(a["node"], a["outcome"]) for a in moved["attempts"]] == [("slow", "abandoned"), ("small", "succeeded")]
    story = terminal.ok("alloc", "get", allocation_id)
    assert "│ 1 │ slow  │ abandoned │ operator_retry" in story and "│ 2 │ small │ succeeded │" in story

    assert f"Cancelling allocation {allocation_id}" in terminal.ok("alloc", "cancel", allocation_id)
    assert terminal.wait_for(allocation_id, "cancelled")["bundles"] == []
    refused = terminal.berth("alloc", "release", allocation_id)
    assert "is cancelled; only an active one can be released (invalid_state, HTTP 409)" in one_error_line(refused)


def test_explain_online_matches_explain_offline_on_the_same_fleet(terminal: Terminal, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(api_fleet())
    for request in (["--gpus", "2"], ["--gpus", "8"], ["--gpus", "3", "--tenant", "globex"]):
        assert terminal.json("explain", *request) == terminal.json("explain", "-f", str(fleet), *request)

    placed = terminal.ok("explain", "--gpus", "2")
    assert "Placed: 2 GPU slices fit on node small in pool lab-1/slices (lab), with 1 alternate" in placed
    assert "Plan on small" in placed and "1 has fewer than 2 GPUs" in placed
    refused = terminal.ok("explain", "--gpus", "3", "--tenant", "globex")
    assert "Refused (quota_exceeded)" in refused

    selector = ["--gpus", "1", "--selector", "device.driver == 'x'"]  # the API's explain takes selectors too
    assert terminal.json("explain", *selector) == terminal.json("explain", "-f", str(fleet), *selector)


def test_capacity_per_pool(terminal: Terminal) -> None:
    [pool] = terminal.json("capacity")["pools"]
    assert (pool["pool"], pool["raw_free_gpus"]) == ("lab-1/slices", 7)
    assert pool["slices"] == {"1": 7, "2": 3, "4": 1, "8": 0}
    table = terminal.ok("capacity", "--region", "lab", "--product", "H200")
    assert re.search(r"┃ VALIDATED GPUS ┃ VALID SLICE BUNDLES ┃ RAW FREE ┃ DEGRADED ┃ FAILED ┃ 1-GPU ┃", table)
    assert re.search(
        r"│ lab-1/slices │ lab +│ gpu_slice │ H200 +│ +3/3 │ +0 │ +7 │ +7 │ +7 │ +7 │ +0 │ +0 │ +7 │ +3 │ +1 │", table
    )

    terminal.wait_for(terminal.json("alloc", "create", "--gpus", "4")["id"], "active")
    [pool] = terminal.json("capacity")["pools"]
    assert (pool["raw_free_gpus"], pool["slices"]) == (3, {"1": 3, "2": 1, "4": 0, "8": 0})
    assert terminal.json("capacity", "--region", "elsewhere")["pools"] == []
    assert "no pools match" in terminal.ok("capacity", "--product", "B200")


def test_nodes_list_cordon_and_uncordon(terminal: Terminal) -> None:
    listed = terminal.ok("nodes", "list")
    for name, gpus in (("big", 4), ("slow", 1), ("small", 2)):
        row = rf"│ {name:<5} │ lab-1/slices │ lab    │ gpu_slice │ H200    │ READY  │ live [0-9:]+ │( +{gpus} │){{3}}"
        assert re.search(row, listed), listed
    shown = terminal.ok("nodes", "get", "big")
    agent, signals = shown.split("agent:")[1].split("health signals")
    assert "agent: live, last seen" in shown and "slot" not in agent  # every slot validates, none is unhealthy
    row = r"│ 0    │ healthy │ gpu    │ 0000:10:00.0 on vfio-pci, AER fatal/non-fatal/correctable 0/0/0, link 32.0 GT/s x16"
    assert re.search(row, signals) and "│ 3    │ healthy │ gpu" in signals, signals  # every slot's signals, by slot

    assert "node big is CORDONED (fleet: READY)" in terminal.ok("nodes", "cordon", "big")
    assert [n["name"] for n in terminal.json("nodes", "list", "--status", "CORDONED")["nodes"]] == ["big"]
    assert "Refused" in terminal.ok("explain", "--gpus", "4")  # only big has 4 GPUs
    uncordoned = terminal.json("nodes", "uncordon", "big")
    assert (uncordoned["name"], uncordoned["status"]) == ("big", "READY")

    missing = terminal.berth("nodes", "cordon", "nosuch")
    assert one_error_line(missing) == "error: node 'nosuch' does not exist (not_found, HTTP 404)"
    as_tenant = terminal.berth("nodes", "cordon", "big", "--token", terminal.served.tenant_tokens["acme"])
    line = one_error_line(as_tenant)
    assert line.startswith("error: this needs the operator role; token:") and line.endswith("(forbidden, HTTP 403)")
    # A tenant reads the nodes of its regions, without their hosts' details.
    seen = terminal.json("nodes", "list", "--token", terminal.served.tenant_tokens["acme"])["nodes"]
    assert sorted(n["name"] for n in seen) == ["big", "slow", "small"]


def test_node_tokens_written_for_agents_are_kept_on_a_rerun(terminal: Terminal, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "big").touch(mode=0o644)  # an empty file left behind, readable by everyone
    (tokens / "big").chmod(0o644)
    written = terminal.ok("tokens", "create", "--node", "small", "--node", "big", "--to-dir", str(tokens))
    assert f"node token for big written to {tokens / 'big'}" in written
    assert (tokens / "big").stat().st_mode & 0o777 == 0o600  # replaced, not written into with its mode
    first = (tokens / "small").read_text()
    assert first.startswith("berth_") and (tokens / "small").stat().st_mode & 0o777 == 0o600
    assert "already holds a token; kept" in terminal.ok("tokens", "create", "--node", "small", "--to-dir", str(tokens))
    assert (tokens / "small").read_text() == first


def test_tokens_create_issues_working_tokens(terminal: Terminal) -> None:
    issued = terminal.ok("tokens", "create", "--tenant", "globex", "--label", "ci")
    assert issued.startswith("Token for a member of tenant globex (shown once; store it now):")
    token = issued.splitlines()[-1]
    assert token.startswith("berth_")
    created = terminal.json("alloc", "create", "--gpus", "1", "--token", token)
    assert terminal.json("alloc", "get", created["id"])["tenant"] == "globex"

    admin = terminal.json("tokens", "create", "--admin")
    assert (admin["role"], admin["tenant"]) == ("admin", None)
    assert len(terminal.json("nodes", "list", "--token", admin["token"])["nodes"]) == 3

    for args, message in (
        ([], "give exactly one of --tenant NAME (viewer or member), --role operator|admin, or --node NAME"),
        (["--admin", "--tenant", "acme"], "give exactly one of --tenant NAME (viewer or member)"),
        (["--role", "operator", "--tenant", "acme"], "give exactly one of --tenant NAME (viewer or member)"),
        (["--role", "owner"], "--role owner: use viewer, member, operator or admin"),
        (["--tenant", "acme", "--expires-in", "soon"], "--expires-in 'soon' is not a duration: "),
        (["--tenant", "acme", "--expires-in", "90"], "--expires-in '90' has no unit: write 90s, 90m or 90h"),
        (["--node", "nosuch"], "unknown node 'nosuch': apply a fleet file that declares it first"),
        (["--tenant", "nobody"], "unknown tenant 'nobody': apply a fleet file that declares it first"),
        (["--admin", "--to-dir", "x"], "--to-dir writes node tokens: give --node NAME (one or more) with --to-dir DIR"),
    ):
        assert message in one_error_line(terminal.berth("tokens", "create", *args))


def test_api_errors_are_one_line(terminal: Terminal) -> None:
    missing = terminal.berth("alloc", "get", "nosuch")
    assert one_error_line(missing) == "error: allocation 'nosuch' does not exist (not_found, HTTP 404)"
    # Another tenant's allocation looks exactly like one that does not exist.
    theirs = terminal.json("alloc", "create", "--gpus", "1", "--tenant", "acme")["id"]
    hidden = terminal.berth("alloc", "cancel", theirs, "--tenant", "globex")
    assert one_error_line(hidden) == f"error: allocation '{theirs}' does not exist (not_found, HTTP 404)"

    invalid = terminal.berth("alloc", "create", "--gpus", "2000", "--label", "bad key=x")
    line = one_error_line(invalid)
    assert "body.gpu_count: Input should be less than or equal to 1024" in line
    assert "body.labels.bad key" in line and line.endswith("(invalid_request, HTTP 422)")
    assert "Input should be" in one_error_line(terminal.berth("alloc", "list", "--state", "sleeping"))

    bad_token = terminal.berth("alloc", "list", "--token", "berth_nope")
    assert one_error_line(bad_token) == "error: the bearer token is unknown (invalid_token, HTTP 401)"
    elsewhere = terminal.berth("capacity", "--api", "http://127.0.0.1:9")  # the context's tokens stay with its API
    assert one_error_line(elsewhere).startswith("error: no API token: pass --token, set BERTH_TOKEN")
    no_such_tenant = terminal.berth("alloc", "list", "--tenant", "initech")
    assert "has no token for tenant 'initech' (it has: acme, globex)" in one_error_line(no_such_tenant)
    assert "--label: expected KEY=VALUE, got 'team'" in one_error_line(
        terminal.berth("alloc", "create", "--gpus", "1", "--label", "team")
    )


def test_an_unreachable_or_unconfigured_api_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    down = runner.invoke(app, ["alloc", "list", "--api", url, "--token", "t"], env=UNSET)
    assert one_error_line(down).startswith(f"error: cannot reach the Berth API at {url}: is `berth up` running?")

    nothing = {**UNSET, "BERTH_STATE_DIR": str(tmp_path)}
    for args in (["capacity"], ["nodes", "list"], ["explain", "--gpus", "1"], ["alloc", "get", "x"]):
        line = one_error_line(runner.invoke(app, args, env=nothing))
        assert line.startswith("error: no Berth API configured: pass --api, set BERTH_API_URL, or start the dev stack")
    no_token = runner.invoke(app, ["capacity", "--api", url], env=nothing)
    assert one_error_line(no_token).startswith("error: no API token: pass --token, set BERTH_TOKEN")


def test_a_node_token_rotated_and_revoked_from_the_command_line(terminal: Terminal, tmp_path: Path) -> None:
    """The compose layout (one directory per node, so each agent mounts only its own): rotation writes the file the
    agent rereads and revokes the old token after the grace period; revocation refuses a node's every token."""
    tokens = tmp_path / "tokens"
    terminal.ok("tokens", "create", "--node", "small", "--to-dir", str(tokens), "--dir-per-node")
    old = (tokens / "small" / "token").read_text().strip()
    assert (tokens / "small" / "token").stat().st_mode & 0o777 == 0o600

    wrong_layout = terminal.berth("tokens", "rotate", "--node", "small", "--to-dir", str(tokens), "--grace", "0")
    assert "is a directory" in one_error_line(wrong_layout) and (tokens / "small" / "token").read_text().strip() == old

    rotated = terminal.ok(
        "tokens", "rotate", "--node", "small", "--to-dir", str(tokens), "--dir-per-node", "--grace", "0"
    )
    assert "revoked the older token(s) of small" in rotated
    new = (tokens / "small" / "token").read_text().strip()
    assert new != old and new.startswith("berth_")

    def answer(token: str) -> str:
        return one_error_line(terminal.berth("nodes", "list", "--token", token))

    def refused_within_five_seconds(token: str) -> None:
        deadline = time.monotonic() + 5  # the API's token cache re-checks its tokens every second
        while "HTTP 401" not in (said := answer(token)):
            assert time.monotonic() < deadline, f"still accepted after 5 s: {said}"
            time.sleep(0.1)

    refused_within_five_seconds(old)
    assert "a node token can only report for its own node" in answer(new)  # live, and still only a node's
    assert "refused everywhere within seconds" in terminal.ok("tokens", "revoke", "--node", "small")
    refused_within_five_seconds(new)
    assert one_error_line(terminal.berth("tokens", "revoke", "--node", "small")) == "error: no live token of node small"
