"""Host discovery against fixture trees shaped like real sysfs: what an operator would see in the inventory for
each kind of host, that nothing a broken host shows makes discovery fail, and that the topology hash moves only when
the host does."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.host.gpu_details import NvmlDetails, RecordedNvidiaSmi
from agent.host.sysfs import discover_host
from fleet.node import FabricClaimMode, Node
from scheduler.host.inventory import FabricRole, GpuDetailSource, HostInventory
from tests.hosts.materialise import materialise
from tests.hosts.sysfs_tree import (
    FIXTURE_HOSTS,
    Fault,
    FixtureHost,
    Function,
    RecordedGpu,
    gpu_on_nvidia,
    hgx_h200,
    j22u15,
    malformed,
    missing_gpu,
    nvidia_smi_xml,
    nvme_mounted,
    vf_declared_twice,
    write_host,
)


def _discover(tmp_path: Path, host: FixtureHost, name: str = "host") -> HostInventory:
    return discover_host(host.write(tmp_path / name))


def _with_faults(host: FixtureHost, *faults: Fault) -> FixtureHost:
    return replace(host, spec=replace(host.spec, faults=host.spec.faults + faults))


def test_an_hgx_host_shows_every_gpu_vf_nvme_and_numa_cell(tmp_path: Path) -> None:
    host = hgx_h200()
    inventory = _discover(tmp_path, host)
    assert inventory.hostname == "hgx-h200"
    assert inventory.problems == []

    assert [gpu.address for gpu in inventory.gpus] == [slot["gpuPci"] for slot in host.node["slots"]]
    assert {(gpu.product, gpu.memory_mib, gpu.driver, gpu.detail_source) for gpu in inventory.gpus} == {
        ("NVIDIA H200", 143771, "vfio-pci", GpuDetailSource.PCI_IDS)
    }
    assert [gpu.numa_node for gpu in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(inventory.iommu_groups[gpu.iommu_group] == [gpu.address] for gpu in inventory.gpus)

    pfs = [device for device in inventory.fabric if device.role is FabricRole.PF]
    vfs = [device for device in inventory.fabric if device.role is FabricRole.VF]
    assert len(pfs) == len(vfs) == 8
    pf = inventory.fabric_device("0000:1a:00.0")
    assert pf is not None and pf.driver == "mlx5_core" and pf.vfs == ["0000:1a:00.1"]
    assert (pf.sriov_totalvfs, pf.sriov_numvfs, pf.netdevs, pf.rdma_devices) == (16, 1, ["ibp26s0"], ["mlx5_0"])
    assert all(vf.parent == vf.address[:-1] + "0" and vf.driver == "vfio-pci" for vf in vfs)

    assert [cell.id for cell in inventory.numa] == [0, 1]
    assert [len(cell.cpus) for cell in inventory.numa] == [112, 112]
    assert inventory.numa[0].cpus[:2] == [0, 1] and 112 in inventory.numa[0].cpus and 56 in inventory.numa[1].cpus
    assert [cell.memory_mib for cell in inventory.numa] == [1024 * 1024, 1024 * 1024]

    grouped = {address for members in inventory.iommu_groups.values() for address in members}
    assert set(inventory.pci_functions) == grouped


def test_every_approved_hgx_slot_finds_its_devices_where_the_fleet_file_says(tmp_path: Path) -> None:
    host = hgx_h200()
    inventory = _discover(tmp_path, host)
    for slot in Node.model_validate(host.node).slots:
        gpu = inventory.gpu(slot.gpu_pci)
        vf = inventory.fabric_device(slot.fabric_vf_pci or "")
        namespace = next(n for n in inventory.nvme if n.known_as(slot.nvme_device or ""))
        assert gpu is not None and gpu.numa_node == slot.numa_node
        assert vf is not None and vf.parent == slot.fabric_parent_pci and vf.iommu_group is not None
        assert namespace.numa_node == slot.numa_node and namespace.in_use == []


def test_nvme_namespaces_are_keyed_by_wwid_with_by_id_links_for_humans(tmp_path: Path) -> None:
    inventory = _discover(tmp_path, hgx_h200())
    assert [n.name for n in inventory.nvme] == [f"nvme{i}n1" for i in range(9)]
    first = inventory.nvme[0]
    assert first.wwid == "eui.0025382000000000" and first.serial == "S6XXXXXX0"
    assert first.by_id == [
        "/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6XXXXXX0",
        "/dev/disk/by-id/nvme-eui.0025382000000000",
    ]
    assert (first.controller_pci, first.numa_node, first.size_bytes) == ("0000:21:00.0", 0, 3_840_755_982_336)
    assert first.known_as(first.wwid) and first.known_as("/dev/nvme0n1")
    boot = inventory.nvme[8]  # the host's own disk: an EFI partition and an LVM physical volume
    assert boot.in_use == ["held by dm-0", "mounted at /boot/efi"]


def test_a_partition_mounted_on_a_slot_nvme_is_reported_as_in_use(tmp_path: Path) -> None:
    inventory = _discover(tmp_path, nvme_mounted())
    in_use = {n.name: n.in_use for n in inventory.nvme if n.in_use}
    assert in_use == {"nvme1n1": ["mounted at /var/lib/docker"], "nvme8n1": ["held by dm-0", "mounted at /boot/efi"]}


def test_j22u15_has_parent_fabric_devices_and_no_vfs(tmp_path: Path) -> None:
    host = j22u15()
    inventory = _discover(tmp_path, host)
    assert len(inventory.gpus) == 8 and all(gpu.driver == "vfio-pci" for gpu in inventory.gpus)
    assert [device.role for device in inventory.fabric] == [FabricRole.PF] * 8
    assert {(device.sriov_numvfs, device.sriov_totalvfs, tuple(device.vfs)) for device in inventory.fabric} == {
        (0, 16, ())
    }
    slots = Node.model_validate(host.node).slots
    assert {slot.fabric_claim_mode for slot in slots} == {FabricClaimMode.SHARED_PARENT}
    assert all(slot.fabric_vf_pci is None for slot in slots)
    assert [slot.fabric_parent_pci for slot in slots][:2] == ["0000:1a:00.0", "0000:1a:00.0"]
    assert all(inventory.fabric_device(slot.fabric_parent_pci or "") is not None for slot in slots)


def test_an_absent_gpu_is_simply_not_there(tmp_path: Path) -> None:
    host = missing_gpu()
    inventory = _discover(tmp_path, host)
    assert len(inventory.gpus) == 7 and inventory.gpu("0000:bb:00.0") is None
    assert inventory.problems == []  # absence is a fact for validation, not an unreadable entry
    assert len([slot for slot in host.node["slots"] if slot["approved"]]) == 8


def test_a_vf_declared_by_two_slots_exists_once_on_the_host(tmp_path: Path) -> None:
    host = vf_declared_twice()
    inventory = _discover(tmp_path, host)
    slots = host.node["slots"]
    assert slots[2]["fabricVfPci"] == slots[3]["fabricVfPci"] == "0000:4d:00.1"
    vf = inventory.fabric_device("0000:4d:00.1")
    assert vf is not None and vf.parent == "0000:4d:00.0"
    assert inventory.fabric_device("0000:5d:00.1") is not None  # slot 3's own VF is there, unclaimed


def test_recorded_nvidia_smi_joins_on_the_8_digit_domain_for_the_gpu_the_host_driver_holds(tmp_path: Path) -> None:
    host = gpu_on_nvidia()
    root = host.write(tmp_path / "host")
    recorded = host.recorded_nvidia_smi(root)
    assert recorded is not None and "00000000:1B:00.0" in recorded.read_text()
    assert RecordedNvidiaSmi(recorded).details() == {"0000:1b:00.0": ("NVIDIA H200", 143771)}

    inventory = discover_host(root, gpu_details=RecordedNvidiaSmi(recorded))
    first = inventory.gpus[0]
    assert (first.address, first.driver, first.detail_source) == ("0000:1b:00.0", "nvidia", GpuDetailSource.NVIDIA_SMI)
    assert {gpu.detail_source for gpu in inventory.gpus[1:]} == {GpuDetailSource.PCI_IDS}


def test_details_are_never_put_on_a_vfio_bound_gpu(tmp_path: Path) -> None:
    root = gpu_on_nvidia().write(tmp_path / "host")
    every_gpu = [RecordedGpu(gpu["gpuPci"], "NVIDIA H200 (recorded)", 143000) for gpu in hgx_h200().node["slots"]]
    stale = tmp_path / "stale.xml"  # recorded before seven of them were rebound to vfio-pci
    stale.write_text(nvidia_smi_xml(every_gpu))
    inventory = discover_host(root, gpu_details=RecordedNvidiaSmi(stale))
    assert [gpu.product for gpu in inventory.gpus] == ["NVIDIA H200 (recorded)"] + ["NVIDIA H200"] * 7
    assert inventory.gpus[0].memory_mib == 143000 and inventory.gpus[1].memory_mib == 143771


def test_an_unreadable_recorded_nvidia_smi_is_a_problem_not_a_failure(tmp_path: Path) -> None:
    root = gpu_on_nvidia().write(tmp_path / "host")
    broken = tmp_path / "broken.xml"
    broken.write_text("<nvidia_smi_log><gpu")
    inventory = discover_host(root, gpu_details=RecordedNvidiaSmi(broken))
    assert inventory.gpus[0].detail_source is GpuDetailSource.PCI_IDS
    assert [problem.path for problem in inventory.problems] == [str(broken)]


def test_nvml_details_join_its_8_digit_bus_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NVMLError(Exception):
        pass

    handle = object()
    fake = SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: handle,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:1B:00.0"),
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=143771 * 1024 * 1024),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inventory = discover_host(gpu_on_nvidia().write(tmp_path / "host"), gpu_details=NvmlDetails())
    assert inventory.gpus[0].detail_source is GpuDetailSource.NVML and inventory.gpus[0].memory_mib == 143771

    def no_driver() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    monkeypatch.setattr(fake, "nvmlInit", no_driver)
    assert NvmlDetails().details() == {}


def test_malformed_entries_become_problems_and_discovery_carries_on(tmp_path: Path) -> None:
    inventory = _discover(tmp_path, malformed())
    garbage = inventory.gpu("0000:cd:00.0")
    assert garbage is not None and garbage.numa_node is None and garbage.driver == "vfio-pci"
    assert [(p.path, p.device) for p in inventory.problems_for("0000:cd:00.0")] == [
        ("/sys/bus/pci/devices/0000:cd:00.0/numa_node", "0000:cd:00.0")
    ]
    assert inventory.gpu("0000:dc:00.0") is None  # its vendor cannot be read: not known to be a GPU
    assert [p.path for p in inventory.problems_for("0000:dc:00.0")] == ["/sys/bus/pci/devices/0000:dc:00.0/vendor"]
    assert "0000:dc:00.0" in inventory.iommu_groups[27] and "0000:dc:00.0" not in inventory.pci_functions
    assert len(inventory.gpus) == 7 and len(inventory.fabric) == 16 and len(inventory.nvme) == 9


@pytest.mark.parametrize(
    ("fault", "device"),
    [
        (Fault.dangling("sys/bus/pci/devices/0000:1b:00.0"), "0000:1b:00.0"),
        (Fault.dangling("sys/bus/pci/devices/0000:1b:00.0/driver"), "0000:1b:00.0"),
        (Fault.text("sys/bus/pci/devices/0000:1b:00.0/class", "3D controller\n"), "0000:1b:00.0"),
        (Fault.text("sys/bus/pci/devices/0000:1a:00.0/sriov_numvfs", "\xff\n"), "0000:1a:00.0"),
        (Fault.dangling("sys/bus/pci/devices/0000:1a:00.1/physfn"), "0000:1a:00.1"),
        (Fault.dangling("sys/block/nvme0n1"), "nvme0n1"),
        (Fault.directory("sys/block/nvme0n1/wwid"), "nvme0n1"),
        (Fault.text("sys/block/nvme0n1/size", "lots\n"), "nvme0n1"),
        (Fault.dangling("sys/block/nvme0n1/device"), "nvme0n1"),
        (Fault.text("sys/devices/system/node/node1/cpulist", "0-x\n"), None),
        (Fault.directory("sys/devices/system/node/node1/meminfo"), None),
        (Fault.text("sys/kernel/iommu_groups/20/devices/nonsense", ""), "nonsense"),
        (Fault.dangling("sys/bus/pci/devices/0000:1b:00.0/iommu_group"), "0000:1b:00.0"),
    ],
)
def test_a_broken_entry_is_a_problem_naming_its_device(tmp_path: Path, fault: Fault, device: str | None) -> None:
    inventory = _discover(tmp_path, _with_faults(hgx_h200(), fault))
    assert [(problem.path, problem.device) for problem in inventory.problems] == [("/" + fault.path, device)]


def test_a_permission_error_is_a_problem() -> None:
    """An entry the agent may not read. Root reads whatever the mode says, so as root (CI) discovery runs in a forked
    child that has dropped to `nobody` (modules already loaded, nothing re-imported), over a tree it may traverse."""
    home = Path(tempfile.mkdtemp(prefix="berth-perm-"))
    try:
        home.chmod(0o755)
        root = hgx_h200().write(home / "host")
        (root / "sys/bus/pci/devices/0000:1b:00.0/numa_node").chmod(0)
        inventory = _discover_as_nobody(root) if os.geteuid() == 0 else discover_host(root)
    finally:
        shutil.rmtree(home)
    assert inventory.gpus[0].numa_node is None
    assert [p.path for p in inventory.problems] == ["/sys/bus/pci/devices/0000:1b:00.0/numa_node"]


def _discover_as_nobody(root: Path) -> HostInventory:
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and leaves at once
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(writer, discover_host(root).model_dump_json().encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(child, 0)
    return HostInventory.model_validate_json(answer)


def test_no_numa_firmware_and_no_iommu_are_facts_not_problems(tmp_path: Path) -> None:
    host = hgx_h200()
    inventory = _discover(tmp_path, replace(host, spec=replace(host.spec, iommu=False, numa_sysfs=False)))
    assert inventory.problems == []
    assert {(gpu.numa_node, gpu.iommu_group) for gpu in inventory.gpus} == {(None, None)}
    assert inventory.iommu_groups == {} and inventory.pci_functions == {}
    assert [(cell.id, len(cell.cpus), cell.memory_mib) for cell in inventory.numa] == [(0, 224, 2 * 1024 * 1024)]


def test_an_iommu_group_shows_every_function_in_it_bridges_and_audio_included(tmp_path: Path) -> None:
    host = hgx_h200()
    gpu = replace(
        host.spec.gpus[0],
        functions=(Function("0000:1b:00.1", "10de", "22e8", "040300", "snd_hda_intel", 0, 20),),
    )
    bridge = Function("0000:19:00.0", "1000", "c030", "060400", "pcieport", 0, 20)
    spec = replace(host.spec, gpus=(gpu, *host.spec.gpus[1:]), functions=(bridge,))
    inventory = _discover(tmp_path, replace(host, spec=spec))
    assert inventory.iommu_groups[20] == ["0000:19:00.0", "0000:1b:00.0", "0000:1b:00.1"]
    assert inventory.gpus[0].functions == ["0000:1b:00.1"]
    audio, bridge_seen = inventory.pci_functions["0000:1b:00.1"], inventory.pci_functions["0000:19:00.0"]
    assert (audio.driver, audio.class_code, bridge_seen.is_bridge) == ("snd_hda_intel", "040300", True)


def test_links_cannot_lead_discovery_out_of_its_root(tmp_path: Path) -> None:
    faults = (
        Fault.remove("proc/sys/kernel/hostname"),
        Fault.dangling("proc/sys/kernel/hostname", "../../../../../../../../../../etc/hostname"),
        Fault.remove("sys/bus/pci/devices/0000:1b:00.0"),
        Fault.dangling("sys/bus/pci/devices/0000:1b:00.0", "/sys/devices/pci0000:1b/0000:1b:00.0"),
    )
    inventory = _discover(tmp_path, _with_faults(hgx_h200(), *faults))
    assert inventory.hostname is None  # not the machine running the test's /etc/hostname
    gpu = inventory.gpu("0000:1b:00.0")  # an absolute link is read inside the root, as in a chroot
    assert gpu is not None and gpu.product == "NVIDIA H200"


def test_the_topology_hash_is_stable_and_moves_when_a_driver_is_rebound(tmp_path: Path) -> None:
    host = hgx_h200()
    first = _discover(tmp_path, host, "first")
    assert discover_host(tmp_path / "first").topology_hash() == first.topology_hash()
    assert _discover(tmp_path, host, "second").topology_hash() == first.topology_hash()
    rebound = replace(host.spec.gpus[3], driver="nvidia")
    write_host(tmp_path / "third", replace(host.spec, gpus=(*host.spec.gpus[:3], rebound, *host.spec.gpus[4:])))
    assert discover_host(tmp_path / "third").topology_hash() != first.topology_hash()


def test_every_fixture_materialises_with_a_valid_fleet_node(tmp_path: Path) -> None:
    roots = materialise(tmp_path)
    assert [root.name for root in roots] == [make().name for make in FIXTURE_HOSTS]
    for host in [make() for make in FIXTURE_HOSTS]:
        node = Node.model_validate_json((tmp_path / f"{host.name}.node.json").read_text())
        assert node.name == host.name and len(node.slots) == 8
        assert discover_host(tmp_path / host.name).hostname == host.name
