"""Wiping a released slot: the exact commands for each NVMe capability (what Ironic does), the GPU's function-level
reset through sysfs, and every failure reported with its reason rather than swallowed."""

from __future__ import annotations

import json
from pathlib import Path

from agent.host.wipe import Ran, RecordingRunner, SubprocessRunner, wipe_slot
from fleet.node import Slot

DEVICE = "/dev/disk/by-id/nvme-slot1"
RESET = "/sys/bus/pci/devices/0000:3c:00.0/reset"


def _slot(nvme: str | None = DEVICE) -> Slot:
    return Slot.model_validate({"index": 1, "gpuPci": "0000:3c:00.0", "nvmeDevice": nvme})


def _controller(oacs: int, fna: int) -> Ran:
    return Ran(0, json.dumps({"vid": 5197, "oacs": oacs, "fna": fna}))


def test_crypto_erase_where_the_controller_offers_it() -> None:
    runner = RecordingRunner({f"nvme id-ctrl {DEVICE} -o json": _controller(oacs=0x5F, fna=0x04)})
    outcome = wipe_slot(_slot(), runner)
    assert runner.log == [
        f"nvme id-ctrl {DEVICE} -o json",
        f"nvme format {DEVICE} --ses=2 --force",
        f"write 1 > {RESET}",
    ]
    assert (outcome.ok, outcome.nvme_method, outcome.gpu_reset) == (True, "crypto_erase", True)


def test_user_data_erase_without_crypto_erase() -> None:
    runner = RecordingRunner({f"nvme id-ctrl {DEVICE} -o json": _controller(oacs=0x02, fna=0x00)})
    assert wipe_slot(_slot(), runner).nvme_method == "user_data_erase"
    assert f"nvme format {DEVICE} --ses=1 --force" in runner.log


def test_discard_without_format_nvm() -> None:
    runner = RecordingRunner({f"nvme id-ctrl {DEVICE} -o json": _controller(oacs=0x00, fna=0x04)})
    assert wipe_slot(_slot(), runner).nvme_method == "discard"
    assert runner.log[1] == f"blkdiscard --force {DEVICE}"


def test_failures_are_reported_with_their_reason_and_stop_the_wipe() -> None:
    failing = RecordingRunner(
        {
            f"nvme id-ctrl {DEVICE} -o json": _controller(oacs=0x02, fna=0x04),
            f"nvme format {DEVICE} --ses=2 --force": Ran(1, stderr="NVMe status: Access Denied: format in progress"),
        }
    )
    outcome = wipe_slot(_slot(), failing)
    assert outcome.error == f"NVMe {DEVICE}: crypto erase failed: NVMe status: Access Denied: format in progress"
    assert not outcome.gpu_reset and not any(line.startswith("write") for line in failing.log)

    unreadable = RecordingRunner({f"nvme id-ctrl {DEVICE} -o json": Ran(0, "not json")})
    assert wipe_slot(_slot(), unreadable).error == f"NVMe {DEVICE}: nvme id-ctrl gave no readable JSON"

    refused = RecordingRunner(
        {f"nvme id-ctrl {DEVICE} -o json": _controller(oacs=0x02, fna=0x04)}, refused_writes={RESET}
    )
    assert "GPU 0000:3c:00.0 reset failed" in (wipe_slot(_slot(), refused).error or "")


def test_a_slot_without_nvme_only_resets_its_gpu() -> None:
    runner = RecordingRunner()
    assert wipe_slot(_slot(nvme=None), runner).ok and runner.log == [f"write 1 > {RESET}"]


def test_the_subprocess_runner_writes_under_its_root_and_reports_missing_tools(tmp_path: Path) -> None:
    reset = tmp_path / RESET.lstrip("/")
    reset.parent.mkdir(parents=True)
    reset.write_text("")
    runner = SubprocessRunner(tmp_path)
    runner.write(Path(RESET), "1")
    assert reset.read_text() == "1"
    assert runner.run(["berth-no-such-tool", "--version"]).exit_code == -1
