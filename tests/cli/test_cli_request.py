"""`berth alloc create` and `berth explain` with placement constraints (--selector, --cluster-selector, --node), as a
person types them next to `berth up`: the request reaches the scheduler, and a mistake is one line saying what is
valid. Runs against the real API (tests/cli/test_cli_api.py's terminal: lab fleet, nodes slow, small and big in pool
lab-1/slices of region lab, H200 devices publishing productName "NVIDIA H200")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.api.stack import api_fleet
from tests.cli.test_cli_api import Terminal, one_error_line, open_terminal

H200 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'


@pytest.fixture
def terminal(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Terminal]:
    with open_terminal(database_url, temporal_env, tmp_path, api_fleet()) as opened:
        yield opened


def test_constraints_reach_the_scheduler_and_mistakes_are_one_line(terminal: Terminal, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(api_fleet())
    pinned = ["--gpus", "2", "--node", "big", "--selector", H200]
    online = terminal.json("explain", *pinned)
    assert online == terminal.json("explain", "-f", str(fleet), *pinned)
    assert [candidate["node"] for candidate in online["candidates"]] == ["big"]
    gold = terminal.ok("explain", "--gpus", "2", "--cluster-selector", "tier=gold")
    assert "Refused (no_region)" in gold and "no pool matching the cluster selector" in gold

    created = terminal.json("alloc", "create", "--gpus", "2", "--tenant", "acme", "--node", "big", "--selector", H200)
    assert terminal.wait_for(created["id"], "active")["node"] == "big"

    region = one_error_line(terminal.berth("alloc", "create", "--gpus", "1", "--region", "mars"))
    assert region == (  # with the tenant's token (acme, the context's first): its part of the fleet, said as such
        "error: no region 'mars' among the regions your tenant may use; available to you: lab "
        "(unknown_region, HTTP 422)"
    )
    node = one_error_line(terminal.berth("explain", "--gpus", "1", "--node", "huge"))
    assert node == (
        "error: node 'huge' does not exist in the fleet; choose one of: big, slow, small (unknown_node, HTTP 422)"
    )
    selector = one_error_line(terminal.berth("alloc", "create", "--gpus", "1", "--selector", "device.driver =="))
    assert selector == (
        "error: selectors[0] does not compile at 1:15: Syntax error: unexpected end of expression "
        "(invalid_selector, HTTP 422)"
    )
    bad_pair = one_error_line(terminal.berth("alloc", "create", "--gpus", "1", "--cluster-selector", "tier"))
    assert bad_pair == "error: --cluster-selector: expected KEY=VALUE, got 'tier'"
    assert [a["id"] for a in terminal.json("alloc", "list")["allocations"]] == [created["id"]]


def test_user_data_is_read_from_the_file_named_and_a_mistake_is_one_line(terminal: Terminal, tmp_path: Path) -> None:
    config = tmp_path / "cloud-config.yaml"
    config.write_text("#cloud-config\npackages: [htop]\n")
    created = terminal.json("alloc", "create", "--gpus", "2", "--tenant", "acme", "--user-data", str(config))
    assert terminal.wait_for(created["id"], "active")["node"] == "small"  # `slow`, a 1-GPU fit, never boots

    missing = one_error_line(terminal.berth("alloc", "create", "--gpus", "1", "--user-data", str(tmp_path / "nope")))
    assert missing == f"error: --user-data: cannot read '{tmp_path / 'nope'}' (No such file or directory)"
    config.write_text("#cloud-config\nusers: [default]\n")
    refused = one_error_line(terminal.berth("alloc", "create", "--gpus", "1", "--user-data", str(config)))
    assert refused.startswith("error: the request is not valid: body.user_data: may not set users, ")
    assert refused.endswith("(invalid_request, HTTP 422)")
    assert [a["id"] for a in terminal.json("alloc", "list")["allocations"]] == [created["id"]]
