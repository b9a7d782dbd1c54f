"""A slot's health from what its host can see: the agent's sysfs reader over a fixture host shaped like
an HGX H200's /sys, and the pure verdict over it: AER counters rising, a link trained down, a device gone from the
bus, an NVMe critical warning, and the Xids of NVIDIA's catalog."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.host.health import read_signals
from agent.host.rootfs import HostRoot
from agent.host.sysfs import discover_host
from fleet.node import Node
from scheduler.host.health import CORRECTABLE_BURST, DriverSignals, HealthState, PcieSignals, SlotSignals, assess
from tests.hosts.sysfs_tree import hgx_h200, write_pcie_health


def _host(tmp_path: Path) -> tuple[Path, Node]:
    fixture = hgx_h200()
    root = fixture.write(tmp_path / "host")
    node = Node.model_validate(fixture.node)
    for slot in node.slots:  # every device starts clean: no errors, links at their maximum
        for address in (slot.gpu_pci, slot.fabric_vf_pci):
            if address:
                write_pcie_health(root, address)
    return root, node


def _read(root: Path, node: Node) -> dict[int, SlotSignals]:
    signals = read_signals(HostRoot(root), node.slots, discover_host(root))
    return {s.index: s for s in signals}


def test_a_clean_host_is_healthy_and_its_counters_are_read(tmp_path: Path) -> None:
    root, node = _host(tmp_path)
    now = _read(root, node)
    assert sorted(now) == list(range(8))
    gpu = now[0].gpu
    assert gpu is not None and (gpu.present, gpu.driver, gpu.aer_fatal, gpu.link_speed, gpu.link_width) == (
        True,
        "vfio-pci",
        0,
        32.0,
        16,
    )
    assert now[0].nvme is not None and now[0].nvme.present  # the controller behind the slot's namespace
    assert assess(now[0]).signals == {  # what `berth nodes get` shows of the slot
        "gpu": "0000:1b:00.0 on vfio-pci, AER fatal/non-fatal/correctable 0/0/0, link 32.0 GT/s x16 of 32.0 GT/s x16",
        "fabric": "0000:1a:00.1 on vfio-pci, AER fatal/non-fatal/correctable 0/0/0, link 32.0 GT/s x16 of 32.0 GT/s "
        "x16",
        "nvme": f"{now[0].nvme.address} on nvme, AER fatal/non-fatal/correctable ?/?/?, link ? GT/s x? of ? GT/s x?",
    }
    assert all(assess(s, s).state is HealthState.HEALTHY for s in now.values())


def test_rising_aer_counters_fail_or_degrade_the_slot_and_a_standing_count_does_not(tmp_path: Path) -> None:
    root, node = _host(tmp_path)
    gpu = node.slots[2].gpu_pci
    write_pcie_health(root, gpu, fatal=3, nonfatal=1)  # counts from before the agent looked: not news
    before = _read(root, node)
    assert assess(before[2], before[2]).state is HealthState.HEALTHY

    write_pcie_health(root, gpu, fatal=4, nonfatal=1)
    now = _read(root, node)
    verdict = assess(now[2], before[2])
    assert verdict.state is HealthState.FAILED
    assert verdict.reason == f"the GPU {gpu} logged 1 fatal PCIe errors (AER) since the last report"
    assert assess(now[3], before[3]).state is HealthState.HEALTHY  # its neighbour is untouched

    write_pcie_health(root, gpu, fatal=4, nonfatal=2, correctable=CORRECTABLE_BURST - 1)
    later = _read(root, node)
    assert assess(later[2], now[2]).reasons == [
        f"the GPU {gpu} logged 1 non-fatal PCIe errors (AER) since the last report"
    ]
    write_pcie_health(root, gpu, fatal=4, nonfatal=2, correctable=2 * CORRECTABLE_BURST)
    burst = assess(_read(root, node)[2], later[2])
    assert burst.state is HealthState.DEGRADED and "correctable PCIe errors" in (burst.reason or "")


def test_a_link_trained_down_degrades_the_slot(tmp_path: Path) -> None:
    root, node = _host(tmp_path)
    vf = node.slots[4].fabric_vf_pci
    assert vf is not None
    write_pcie_health(root, vf, speed="16.0 GT/s PCIe", width=8)
    verdict = assess(_read(root, node)[4])
    assert verdict.state is HealthState.DEGRADED
    assert verdict.reasons == [f"the fabric VF {vf}'s link trained at 16.0 GT/s x8, below its 32.0 GT/s x16"]


def test_a_gpu_gone_from_the_bus_fails_its_slot_and_one_never_there_is_unknown(tmp_path: Path) -> None:
    root, node = _host(tmp_path)
    gpu = node.slots[5].gpu_pci
    before = _read(root, node)
    device = (root / "sys/bus/pci/devices" / gpu).resolve()
    (root / "sys/bus/pci/devices" / gpu).unlink()  # the kernel removes the function when the device drops
    shutil.rmtree(device)
    now = _read(root, node)
    verdict = assess(now[5], before[5])
    assert verdict.state is HealthState.FAILED and verdict.reason == f"the GPU {gpu} is gone from the PCI bus"
    # An agent that never saw it (it started after the GPU fell off, or the slot names a GPU the host never had):
    # validation says `gpu_absent`; health says unknown, never healthy, and no failure of its own.
    first = assess(now[5])
    assert first.state is HealthState.UNKNOWN and first.reason == f"the GPU {gpu} is not on the PCI bus"


@pytest.mark.parametrize(
    ("xid", "state", "bucket"),
    [
        (48, HealthState.FAILED, "RESET_GPU"),
        (63, HealthState.DEGRADED, "RESET_GPU"),
        (64, HealthState.FAILED, "RESET_GPU"),
        (79, HealthState.FAILED, "RESTART_BM"),
        (94, HealthState.DEGRADED, "RESTART_APP"),
        (95, HealthState.FAILED, "RESET_GPU"),
        (119, HealthState.FAILED, "RESET_GPU"),
    ],
)
def test_each_xid_is_judged_by_nvidias_resolution_bucket(xid: int, state: HealthState, bucket: str) -> None:
    verdict = assess(SlotSignals(index=0, gpu=_clean(), xids=[xid]))
    assert verdict.state is state
    assert (
        verdict.reason is not None
        and verdict.reason.startswith(f"Xid {xid} (")
        and f"NVIDIA says {bucket}" in verdict.reason
    )


def test_an_applications_own_xid_leaves_the_gpu_healthy_and_an_unknown_one_does_not() -> None:
    assert assess(SlotSignals(index=0, gpu=_clean(), xids=[13, 31, 45])).state is HealthState.HEALTHY
    unknown = assess(SlotSignals(index=0, gpu=_clean(), xids=[999]))
    assert unknown.state is HealthState.DEGRADED and "not in NVIDIA's catalog" in (unknown.reason or "")


def test_nvme_critical_warnings_and_a_failed_reset_and_nothing_read() -> None:
    temperature = assess(SlotSignals(index=0, gpu=_clean(), nvme_critical_warning=0b10))
    assert temperature.state is HealthState.DEGRADED and temperature.reason == (
        "the NVMe reports a critical warning: temperature"
    )
    read_only = assess(SlotSignals(index=0, gpu=_clean(), nvme_critical_warning=0b1010))
    assert read_only.state is HealthState.FAILED and read_only.reasons[0].endswith("read only")
    reset = assess(SlotSignals(index=0, gpu=_clean(), wipe_failed="FLR timed out"))
    assert reset.state is HealthState.FAILED and reset.reason == "the wipe's function-level reset failed: FLR timed out"
    assert assess(SlotSignals(index=0)).state is HealthState.UNKNOWN  # never taken for healthy


def test_a_stopped_vm_fails_the_slots_it_held_whatever_the_gpus_own_health() -> None:
    """The VM's QEMU killed, a crash, a poweroff inside: the allocation lost its GPUs, so each slot it held is failed
    with the runtime's words, above the `unknown` of a guest that cannot answer."""
    stopped = "the VM berth-a-1 is not running (its QEMU process ended unexpectedly)"
    verdict = assess(SlotSignals(index=3, gpu=_clean(), guest=DriverSignals(answered=False, vm_stopped=stopped)))
    assert verdict.state is HealthState.FAILED
    assert verdict.reasons == [f"the VM holding the GPU stopped: {stopped}"]
    assert verdict.signals["guest"] == f"VM stopped ({stopped})"
    assert verdict.recovery_action is None and not verdict.drain_node

    silent = assess(SlotSignals(index=3, gpu=_clean(), guest=DriverSignals(answered=False, detail="no guest agent")))
    assert silent.state is HealthState.UNKNOWN  # not answering is not stopping
    assert "VM stopped" not in silent.signals["guest"] and "stopped" not in (silent.reason or "")

    # The line is bounded like every signal line; the reason carries the whole of what the runtime said.
    long = "x" * 512
    bounded = assess(SlotSignals(index=3, gpu=_clean(), guest=DriverSignals(answered=False, vm_stopped=long)))
    assert len(bounded.signals["guest"]) == 512 and bounded.reasons == [f"the VM holding the GPU stopped: {long}"]


def _clean() -> PcieSignals:
    return PcieSignals(
        address="0000:18:00.0",
        present=True,
        driver="vfio-pci",
        aer_fatal=0,
        link_speed=32.0,
        max_link_speed=32.0,
        link_width=16,
        max_link_width=16,
    )
