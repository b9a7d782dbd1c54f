"""The host-side signals beyond sysfs, through the real topology driver over a fixture host whose slot 0
GPU is bound to the host's `nvidia` driver: NVML's recorded health sequences (tests/hosts/nvml/) and an NVMe's
SMART log as nvme-cli prints it (tests/hosts/nvme/), each judged at each look by the one verdict function."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host.nvml_health import PynvmlHealth, RecordedNvml
from agent.host.topology import HostTopology
from agent.host.wipe import Ran, RecordingRunner
from fleet.node import Node
from scheduler.host.health import HealthState, SlotHealth, SlotSignals, assess
from tests.hosts.sysfs_tree import gpu_on_nvidia, write_pcie_health

HOSTS = Path(__file__).resolve().parents[2] / "hosts"
SMART = "nvme smart-log /dev/nvme0n1 -o json"  # slot 0's namespace


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _topology(tmp_path: Path, nvml: str | None, smart: str = "smart-log-clean.json") -> tuple[HostTopology, Node]:
    fixture = gpu_on_nvidia()
    root = fixture.write(tmp_path / "host")
    node = Node.model_validate(fixture.node)
    for slot in node.slots:
        for address in (slot.gpu_pci, slot.fabric_vf_pci):
            if address:
                write_pcie_health(root, address)
    runner = RecordingRunner({SMART: Ran(0, (HOSTS / "nvme" / smart).read_text())})
    recorded = RecordedNvml(HOSTS / "nvml" / nvml) if nvml else None
    return HostTopology(root, runner=runner, nvml=recorded), node


def _looks(topology: HostTopology, node: Node, count: int) -> list[SlotHealth]:
    """Slot 0's verdict at each of `count` looks, each judged against the previous look, as the reporter does."""
    host = topology.discover()
    verdicts, before = [], None
    for _ in range(count):
        [now] = [s for s in topology.signals(node.slots, host) if s.index == 0]
        verdicts.append(assess(now, before))
        before = now
    return verdicts


def test_a_double_bit_error_nvml_reports_fails_the_slot_and_the_pending_remap_keeps_it_out(tmp_path: Path) -> None:
    topology, node = _topology(tmp_path, "dbe-then-quiet.json")
    clean, dbe, quiet = _looks(topology, node, 3)
    assert clean.state is HealthState.HEALTHY
    assert dbe.state is HealthState.FAILED
    assert dbe.reasons == [
        "Xid 48 (Double bit ECC error): NVIDIA says RESET_GPU",
        "a row remap of the GPU's memory waits for a GPU reset (NVML)",
        "the GPU logged 1 uncorrectable ECC errors (NVML)",
    ]
    # No new event and the count stands: the pending remap alone (the control plane keeps `failed` until repair).
    assert (quiet.state, quiet.reasons) == (
        HealthState.DEGRADED,
        ["a row remap of the GPU's memory waits for a GPU reset (NVML)"],
    )


def test_a_gpu_nvml_has_lost_fails_its_slot(tmp_path: Path) -> None:
    topology, node = _topology(tmp_path, "fallen-off-the-bus.json")
    clean, lost = _looks(topology, node, 2)
    assert clean.state is HealthState.HEALTHY
    assert (lost.state, lost.reasons) == (
        HealthState.FAILED,
        [
            "the host's driver lost the GPU (NVML: GPU is lost)",
            "Xid 79 (GPU has fallen off the bus): NVIDIA says RESTART_BM",
        ],
    )


def test_only_the_gpus_the_host_driver_holds_get_an_nvml_reading(tmp_path: Path) -> None:
    topology, node = _topology(tmp_path, "dbe-then-quiet.json")
    signals = {s.index: s for s in topology.signals(node.slots, topology.discover())}
    assert signals[0].nvml is not None and signals[0].gpu is not None and signals[0].gpu.driver == "nvidia"
    assert all(signals[i].nvml is None for i in range(1, 8))  # on vfio-pci: invisible to NVML


def test_an_nvme_whose_smart_log_says_read_only_fails_its_slot_and_is_read_once_a_minute(tmp_path: Path) -> None:
    topology, node = _topology(tmp_path, None, smart="smart-log-read-only.json")
    assert topology.smart is not None
    topology.smart.clock = clock = Clock()
    [verdict] = _looks(topology, node, 1)
    assert verdict.state is HealthState.FAILED
    assert verdict.reasons == [
        "the NVMe reports a critical warning: read only",
        "the NVMe reports a critical warning: spare below threshold",
    ]
    _looks(topology, node, 2)
    runner = topology.smart.runner
    assert isinstance(runner, RecordingRunner) and runner.log.count(SMART) == 1
    clock.now += 60
    _looks(topology, node, 1)
    assert runner.log.count(SMART) == 2


def test_a_clean_smart_log_and_an_unreadable_one_say_nothing(tmp_path: Path) -> None:
    topology, node = _topology(tmp_path, None)
    [verdict] = _looks(topology, node, 1)
    assert verdict.state is HealthState.HEALTHY
    assert topology.smart is not None
    topology.smart.runner = RecordingRunner({SMART: Ran(1, stderr="smart log: Input/output error")})
    topology.smart.clock = lambda: 10**9
    [now] = [s for s in topology.signals(node.slots, topology.discover()) if s.index == 0]
    assert now.nvme_critical_warning is None and assess(now).state is HealthState.HEALTHY


def test_nvml_without_a_driver_says_nothing() -> None:
    """This machine has no NVIDIA driver: the real NVML reader answers nothing, as on a slice host whose GPUs are
    all on vfio-pci, rather than failing the look."""
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver: NVML may rightly answer")
    assert PynvmlHealth().read() == {}
    assert SlotSignals(index=0).nvml is None
