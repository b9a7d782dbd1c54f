"""Berth's host side over a real machine's recordings (tests/hosts/recorded/h200-guest-2026-11-27/: one NVIDIA H200
passed through to a virtual machine, driver 580.159.04): discovery on its tree as a root, the NVML health and
detail readers over its recorded NVML, the guest-side parser over its `nvidia-smi -q`; and the same recordings with
one value changed to an error state, each judged by the one verdict function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.guest_health import Exited, guest_signals
from agent.host.gpu_details import NvmlDetails, RecordedNvidiaSmi
from agent.host.nvml_health import PynvmlHealth
from agent.host.sysfs import discover_host
from agent.host.topology import HostTopology
from fleet.node import Slot
from scheduler.host.health import HealthState, PcieSignals, RecoveryAction, SlotHealth, SlotSignals, assess
from tests.hosts.recorded import H200_GUEST, RecordedPynvml, host_root, nvidia_smi_q

GPU = "0000:00:06.0"
PRESENT = PcieSignals(address=GPU, present=True, driver="nvidia")  # the GPU's function as the recorded sysfs shows it


def what_berth_made_of_it() -> dict[str, object]:
    """The recording's own account of what Berth's code found on the machine: `== <section>` then its JSON."""
    sections: dict[str, object] = {}
    for part in (H200_GUEST / "berth-discover-and-health.txt").read_text().split("== ")[1:]:
        name, _, body = part.partition("\n")
        sections[name.strip()] = json.loads(body)
    return sections


def guest_verdict(text: str) -> SlotHealth:
    dmesg = (H200_GUEST / "dmesg.txt").read_text()
    [reading] = guest_signals(Exited(0, stdout=text), Exited(0, stdout=dmesg), gpus=1)
    return assess(SlotSignals(index=0, gpu=PRESENT, guest=reading))


def nvml_verdict(**changes: object) -> SlotHealth:
    reading = PynvmlHealth(RecordedPynvml(changes=changes)).read()[GPU]
    return assess(SlotSignals(index=0, gpu=PRESENT, nvml=reading))


# --- discovery -----------------------------------------------------------------------------------------------------


def test_discovery_on_the_recorded_tree_finds_what_it_found_on_the_machine(tmp_path: Path) -> None:
    recorded = what_berth_made_of_it()["discover"]
    host = discover_host(host_root(tmp_path), gpu_details=NvmlDetails(RecordedPynvml()))
    found = host.model_dump(mode="json")
    for key in ("gpus", "fabric", "nvme", "numa", "iommu_groups", "pci_functions"):
        assert found[key] == recorded[key], key  # type: ignore[index]


def test_the_recreated_links_lead_where_they_did_on_the_machine(tmp_path: Path) -> None:
    [gpu] = discover_host(host_root(tmp_path)).gpus
    assert (gpu.address, gpu.driver, gpu.product, gpu.memory_mib) == (GPU, "nvidia", "NVIDIA H200", 143771)


def test_a_vm_guest_says_which_sources_it_lacks_one_line_each_and_still_reports_its_gpu(tmp_path: Path) -> None:
    host = discover_host(host_root(tmp_path))
    assert [gpu.address for gpu in host.gpus] == [GPU]
    lines = {problem.path: problem.message for problem in host.problems}
    assert set(lines) == {
        "/sys/kernel/iommu_groups",
        "/sys/bus/pci/devices/*/aer_dev_fatal",
        "/sys/bus/pci/devices/*/numa_node",
    }
    assert "no IOMMU groups" in lines["/sys/kernel/iommu_groups"]
    assert (
        f"no PCIe AER counters (its PCIe port services are off): no PCIe errors can be read for {GPU}"
        in (lines["/sys/bus/pci/devices/*/aer_dev_fatal"])
    )
    assert f"no NUMA node (numa_node -1) for {GPU}" in lines["/sys/bus/pci/devices/*/numa_node"]
    assert all(problem.device is None for problem in host.problems)  # no slot is invalid for these alone


def test_a_host_without_the_hypervisor_flag_gets_no_such_lines(tmp_path: Path) -> None:
    root = host_root(tmp_path)
    cpuinfo = root / "proc" / "cpuinfo"
    cpuinfo.write_text(cpuinfo.read_text().replace(" hypervisor", ""))
    assert discover_host(root).problems == []


def test_the_recorded_machine_s_gpu_reads_its_link_through_the_topology_driver(tmp_path: Path) -> None:
    topology = HostTopology(host_root(tmp_path), nvml=PynvmlHealth(RecordedPynvml()))
    [signals] = topology.signals([Slot(index=0, gpu_pci=GPU)], topology.discover())
    assert signals.gpu is not None and signals.nvml is not None
    assert (signals.gpu.driver, signals.gpu.link_speed, signals.gpu.link_width) == ("nvidia", 32.0, 16)
    assert (signals.gpu.aer_fatal, signals.gpu.aer_nonfatal, signals.gpu.aer_correctable) == (None, None, None)
    assert assess(signals).state is HealthState.HEALTHY


# --- NVML and the detail sources -----------------------------------------------------------------------------------


def test_the_nvml_health_reader_reads_what_it_read_on_the_machine_and_the_driver_s_advice() -> None:
    recorded = what_berth_made_of_it()["nvml health"][GPU]  # type: ignore[index]
    reading = PynvmlHealth(RecordedPynvml()).read()[GPU]
    for key, value in recorded.items():
        assert getattr(reading, key) == value, key
    assert reading.retirement_pending is None  # NotSupported on Hopper: it remaps rows instead
    assert (reading.recovery_action, reading.channel_repair_pending, reading.tpc_repair_pending) == (
        RecoveryAction.NONE,
        False,
        False,
    )
    assert nvml_verdict().state is HealthState.HEALTHY


def test_both_detail_sources_name_the_gpu_and_its_memory_as_the_driver_does() -> None:
    expected = {GPU: ("NVIDIA H200", 143771)}
    assert NvmlDetails(RecordedPynvml()).details() == expected
    assert RecordedNvidiaSmi(H200_GUEST / "nvidia-smi-q.xml").details() == expected


@pytest.mark.parametrize(
    ("changes", "state", "reason", "drain"),
    [
        (
            {"recovery_action": [0, 1]},
            HealthState.DEGRADED,
            "the host driver's recovery action is GPU reset (NVML): a GPU reset repairs it",
            False,
        ),
        (
            {"recovery_action": [0, 2]},
            HealthState.FAILED,
            "the host driver's recovery action is node reboot (NVML): the OS may be inconsistent until the node "
            "reboots: drain the node",
            True,
        ),
        (
            {"recovery_action": [0, 4]},
            HealthState.FAILED,
            "the host driver's recovery action is drain and reset (NVML): it runs at reduced capacity until drained "
            "and reset: drain the node",
            True,
        ),
        (
            {"repair_status": [1, 0]},
            HealthState.DEGRADED,
            "a channel repair of the GPU waits for a GPU reset (NVML)",
            False,
        ),
        (
            {"repair_status": [0, 1]},
            HealthState.DEGRADED,
            "a TPC repair of the GPU waits for a GPU reset (NVML)",
            False,
        ),
        (
            {"remapped_rows": [0, 1, 1, 0]},
            HealthState.DEGRADED,
            "a row remap of the GPU's memory waits for a GPU reset (NVML)",
            False,
        ),
    ],
)
def test_one_recorded_nvml_value_in_an_error_state_changes_the_verdict(
    changes: dict[str, object], state: HealthState, reason: str, drain: bool
) -> None:
    judged = nvml_verdict(**changes)
    assert (judged.state, judged.reasons, judged.drain_node) == (state, [reason], drain)


def test_berth_nodes_get_shows_the_action_by_name_in_the_reason_and_the_signal_line() -> None:
    judged = nvml_verdict(recovery_action=[0, 2])
    assert judged.recovery_action is RecoveryAction.NODE_REBOOT
    assert "recovery action is node reboot" in judged.reason  # type: ignore[operator]
    assert "recovery action node reboot" in judged.signals["nvml"]


def test_a_driver_that_cannot_give_its_advice_is_not_an_error() -> None:
    reading = PynvmlHealth(
        RecordedPynvml(
            changes={
                "recovery_action": [3, 0],  # NVML_ERROR_NOT_SUPPORTED
                "repair_status": {"error": "NVMLError_FunctionNotFound"},
            }
        )
    ).read()
    assert (
        reading[GPU].answered and reading[GPU].recovery_action is None and reading[GPU].channel_repair_pending is None
    )
    assert nvml_verdict(recovery_action=[3, 0]).state is HealthState.HEALTHY


# --- the guest-side parser -----------------------------------------------------------------------------------------


def test_the_guest_parser_reads_the_real_nvidia_smi_q() -> None:
    [reading] = guest_signals(Exited(0, stdout=nvidia_smi_q()), Exited(0, (H200_GUEST / "dmesg.txt").read_text()), 1)
    assert reading.answered and not reading.lost and reading.xids == []
    assert (reading.ecc_uncorrectable, reading.remap_pending, reading.remap_failed) == (0, False, False)
    assert reading.retirement_pending is None  # `N/A` on Hopper, never read as a number or a no
    assert (reading.recovery_action, reading.channel_repair_pending, reading.tpc_repair_pending) == (
        RecoveryAction.NONE,
        False,
        False,
    )
    assert guest_verdict(nvidia_smi_q()).state is HealthState.HEALTHY


def _changed(key: str, value: str) -> str:
    """The recorded `-q` with one key's value replaced, the column kept as nvidia-smi aligns it."""
    lines = nvidia_smi_q().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip().startswith(f"{key} ") and ":" in line]
    assert len(hits) == 1, key
    head = lines[hits[0]].split(":", 1)[0]
    lines[hits[0]] = f"{head}: {value}\n"
    return "".join(lines)


@pytest.mark.parametrize(
    ("key", "value", "state", "reason", "drain"),
    [
        (
            "GPU Recovery Action",
            "Reset",
            HealthState.DEGRADED,
            "the guest driver's recovery action is GPU reset (nvidia-smi -q): a GPU reset repairs it",
            False,
        ),
        (
            "GPU Recovery Action",
            "Reboot",
            HealthState.FAILED,
            "the guest driver's recovery action is node reboot (nvidia-smi -q): the OS may be inconsistent until the "
            "node reboots: drain the node",
            True,
        ),
        (
            "GPU Recovery Action",
            "Drain P2P",
            HealthState.DEGRADED,
            "the guest driver's recovery action is drain peer-to-peer (nvidia-smi -q): its peer-to-peer traffic must "
            "stop before the driver names the next action",
            False,
        ),
        (
            "GPU Recovery Action",
            "Drain and Reset",
            HealthState.FAILED,
            "the guest driver's recovery action is drain and reset (nvidia-smi -q): it runs at reduced capacity until "
            "drained and reset: drain the node",
            True,
        ),
        (
            "Channel Repair Pending",
            "Yes",
            HealthState.DEGRADED,
            "a channel repair of the GPU waits for a GPU reset (nvidia-smi -q)",
            False,
        ),
        (
            "TPC Repair Pending",
            "Yes",
            HealthState.DEGRADED,
            "a TPC repair of the GPU waits for a GPU reset (nvidia-smi -q)",
            False,
        ),
        (
            "DRAM Uncorrectable",
            "2",
            HealthState.DEGRADED,
            "the GPU logged 2 uncorrectable ECC errors (nvidia-smi -q)",
            False,
        ),
    ],
)
def test_one_recorded_nvidia_smi_value_in_an_error_state_changes_the_verdict(
    key: str, value: str, state: HealthState, reason: str, drain: bool
) -> None:
    text = nvidia_smi_q()
    if key == "DRAM Uncorrectable":  # the volatile count (the first of two, the other is the aggregate)
        text = text.replace("DRAM Uncorrectable                         : 0", f"DRAM Uncorrectable : {value}", 1)
    else:
        text = _changed(key, value)
    judged = guest_verdict(text)
    assert (judged.state, judged.reasons, judged.drain_node) == (state, [reason], drain)
