"""`berth nodes discover`: on a host, with no services, what it has, which approved slots validate, and a slot block
to start a fleet entry from. Run here against the fixture hosts (trees shaped like /sys) through `--root`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from fleet.node import Slot
from scheduler.host.checks import ValidationState
from scheduler.host.inventory import HostInventory
from scheduler.host.validate import validate_slots
from tests.hosts.materialise import materialise

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hosts")
    materialise(directory)
    return directory


def _discover(hosts: Path, host: str, *extra: str) -> str:
    result = runner.invoke(app, ["nodes", "discover", "--root", str(hosts / host), *extra])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_hgx_host_is_described_and_every_approved_slot_validates(hosts: Path) -> None:
    output = _discover(hosts, "hgx-h200", "-f", str(hosts / "fleet.yaml"), "--node-id", "hgx-h200")
    assert "│ 0000:cd:00.0 │ NVIDIA H200 │ 143771 MiB │ vfio-pci │ 1    │" in output  # no Rich emoji for ':cd:'
    assert "│ 0000:1a:00.1 │ vf   │ 0000:1a:00.0 │" in output
    assert "held by dm-0; mounted at /boot/efi" in output  # the boot disk is in use, and says why
    assert "NUMA 0: 112 CPUs, 1048576 MiB" in output
    assert output.count("│ valid │") == 8 and "8 raw GPUs validate, 8 of them as slice bundles" in output


def test_the_shared_parent_host_counts_raw_gpus_and_no_slices(hosts: Path) -> None:
    output = _discover(hosts, "j22u15", "-f", str(hosts / "fleet.yaml"), "--node-id", "j22u15")
    assert output.count("│ raw_only │") == 8 and "8 raw GPUs validate, 0 of them as slice bundles" in output
    assert "not schedulable for GPU VM slices" in output


def test_each_failing_slot_says_why(hosts: Path) -> None:
    for host, slot, reason in (
        ("missing-gpu", 5, "gpu_absent"),
        ("nvme-mounted", 1, "nvme_in_use"),
        ("gpu-on-nvidia", 0, "gpu_not_vfio"),
        ("malformed", 6, "sysfs_unreadable"),
    ):
        args = ["-f", str(hosts / "fleet.yaml"), "--node-id", host, "--output", "json"]
        document = json.loads(_discover(hosts, host, *args))
        verdicts = {verdict["index"]: verdict for verdict in document["validation"]["slots"]}
        assert verdicts[slot]["state"] == "invalid" and verdicts[slot]["checks"][0] == reason, (host, verdicts[slot])
        assert verdicts[slot]["messages"][0]


def test_the_suggested_block_loads_and_validates_on_its_host(hosts: Path) -> None:
    document = json.loads(_discover(hosts, "hgx-h200", "--suggest", "--output", "json"))
    host = HostInventory.model_validate(document["host"])
    assert document["topology"] == host.topology_hash()
    slots = [
        Slot.model_validate({k: v for k, v in slot.items() if v is not None}) for slot in document["suggestedSlots"]
    ]
    assert [slot.gpu_pci for slot in slots][:2] == ["0000:1b:00.0", "0000:3c:00.0"] and len(slots) == 8
    assert {verdict.state for verdict in validate_slots(slots, host).slots} == {ValidationState.VALID}
    text = _discover(hosts, "hgx-h200", "--suggest")
    assert "Suggested slots (fill in mac and privateIp):" in text and "fabricClaimMode: per_slot_vf" in text


def test_bad_arguments_are_one_line_errors(hosts: Path) -> None:
    half = runner.invoke(app, ["nodes", "discover", "--root", str(hosts / "j22u15"), "--node-id", "j22u15"])
    assert half.exit_code == 1 and "give both --fleet FILE and --node-id NODE" in half.output
    unknown = runner.invoke(
        app, ["nodes", "discover", "--root", str(hosts / "j22u15"), "-f", str(hosts / "fleet.yaml"), "--node-id", "x"]
    )
    assert unknown.exit_code == 1 and "node 'x' is not in" in unknown.output
