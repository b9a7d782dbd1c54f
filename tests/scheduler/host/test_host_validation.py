"""An operator's slots checked against a discovered host by `validate_slots` (docs/seeds.md, "Approved slots,
checked on the host").

The host is an 8x H200 HGX built directly as a `HostInventory`: GPUs and fabric PFs at the j22u05 profile's
addresses (docs/seeds.md, "Slot approval from each host's own topology"), one vfio-bound VF at function .1 of each
PF, one NVMe namespace per slot, every device in its own IOMMU group. The helpers here are shared with
`test_host_suggest.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleet.node import Slot
from scheduler.host.checks import NodeValidation, SlotCheck, ValidationState
from scheduler.host.inventory import (
    FabricDevice,
    FabricRole,
    Gpu,
    HostInventory,
    HostProblem,
    NumaCell,
    NvmeNamespace,
    PciFunction,
)
from scheduler.host.validate import validate_slots

GPU_BUSES = ("1b", "3c", "4b", "5c", "9a", "bb", "cd", "dc")
PF_BUSES = ("1a", "3a", "4d", "5d", "9b", "ba", "ca", "db")
NVME_BUSES = ("1d", "3e", "4c", "5e", "9c", "bc", "ce", "de")
CELL_CPUS = 96
CELL_MEMORY_MIB = 1024 * 1024


def pci(bus: str, function: int = 0) -> str:
    return f"0000:{bus}:00.{function}"


def numa_of(index: int) -> int:
    return 0 if index < 4 else 1


def by_id(index: int) -> str:
    return f"/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S7{index}"


def gpu(index: int, **update: object) -> Gpu:
    fields: dict[str, object] = {
        "address": pci(GPU_BUSES[index]),
        "vendor_id": "10de",
        "device_id": "2335",
        "class_code": "030200",
        "driver": "vfio-pci",
        "numa_node": numa_of(index),
        "iommu_group": 10 + index,
        "product": "NVIDIA H200",
    }
    return Gpu.model_validate(fields | update)


def pf(index: int, *, vfs: int = 1, **update: object) -> FabricDevice:
    fields: dict[str, object] = {
        "address": pci(PF_BUSES[index]),
        "vendor_id": "15b3",
        "device_id": "1021",
        "class_code": "020700",
        "driver": "mlx5_core",
        "numa_node": numa_of(index),
        "iommu_group": 30 + index,
        "role": FabricRole.PF,
        "vfs": [pci(PF_BUSES[index], function) for function in range(1, vfs + 1)],
        "sriov_totalvfs": 8,
        "sriov_numvfs": vfs,
    }
    return FabricDevice.model_validate(fields | update)


def vf(index: int, function: int = 1, **update: object) -> FabricDevice:
    fields: dict[str, object] = {
        "address": pci(PF_BUSES[index], function),
        "vendor_id": "15b3",
        "device_id": "101e",
        "class_code": "020700",
        "driver": "vfio-pci",
        "numa_node": numa_of(index),
        "iommu_group": 50 + 8 * function + index,
        "role": FabricRole.VF,
        "parent": pci(PF_BUSES[index]),
    }
    return FabricDevice.model_validate(fields | update)


def namespace(index: int, **update: object) -> NvmeNamespace:
    fields: dict[str, object] = {
        "name": f"nvme{index}n1",
        "wwid": f"eui.0025388b{index:08x}",
        "serial": f"S7{index}",
        "by_id": [by_id(index), f"/dev/disk/by-id/nvme-eui.0025388b{index:08x}"],
        "size_bytes": 3_840_755_982_336,
        "controller_pci": pci(NVME_BUSES[index]),
        "numa_node": numa_of(index),
    }
    return NvmeNamespace.model_validate(fields | update)


def nvme_controller(namespace: NvmeNamespace, group: int) -> PciFunction:
    return PciFunction(
        address=namespace.controller_pci or "",
        vendor_id="144d",
        device_id="a80c",
        class_code="010802",
        driver="nvme",
        numa_node=namespace.numa_node,
        iommu_group=group,
    )


def inventory(
    gpus: Sequence[Gpu],
    fabric: Sequence[FabricDevice],
    nvme: Sequence[NvmeNamespace],
    *,
    extra: Sequence[PciFunction] = (),
    problems: Sequence[HostProblem] = (),
) -> HostInventory:
    """A host from its devices: IOMMU groups and `pci_functions` are derived from the devices' own groups."""
    controllers = [nvme_controller(ns, 90 + number) for number, ns in enumerate(nvme) if ns.controller_pci]
    functions = [
        PciFunction.model_validate(device.model_dump(include=set(PciFunction.model_fields)))
        for device in [*gpus, *fabric]
    ]
    functions += [*controllers, *extra]
    groups: dict[int, list[str]] = {}
    for function in functions:
        if function.iommu_group is not None:
            groups.setdefault(function.iommu_group, []).append(function.address)
    return HostInventory(
        hostname="j22u05",
        gpus=list(gpus),
        fabric=list(fabric),
        nvme=list(nvme),
        numa=[
            NumaCell(id=cell, cpus=list(range(cell * CELL_CPUS, (cell + 1) * CELL_CPUS)), memory_mib=CELL_MEMORY_MIB)
            for cell in (0, 1)
        ],
        iommu_groups=groups,
        pci_functions={function.address: function for function in functions},
        problems=list(problems),
    )


def hgx_host(
    *,
    gpu_update: Callable[[int], dict[str, object]] = lambda index: {},
    nvme_update: Callable[[int], dict[str, object]] = lambda index: {},
    with_vfs: bool = True,
    extra_fabric: Sequence[FabricDevice] = (),
    extra: Sequence[PciFunction] = (),
    problems: Sequence[HostProblem] = (),
    skip_gpus: tuple[int, ...] = (),
) -> HostInventory:
    """The 8x H200 HGX host; each argument bends one aspect of it for a test."""
    gpus = [gpu(index, **gpu_update(index)) for index in range(8) if index not in skip_gpus]
    fabric = [pf(index, vfs=1 if with_vfs else 0) for index in range(8)]
    if with_vfs:
        fabric += [vf(index) for index in range(8)]
    nvme = [namespace(index, **nvme_update(index)) for index in range(8)]
    return inventory(gpus, [*fabric, *extra_fabric], nvme, extra=extra, problems=problems)


def slot(index: int, **update: object) -> Slot:
    """An HGX slot as an operator writes it in the fleet file (camelCase)."""
    fields: dict[str, object] = {
        "index": index,
        "gpuPci": pci(GPU_BUSES[index]),
        "fabricParentPci": pci(PF_BUSES[index]),
        "fabricVfPci": pci(PF_BUSES[index], 1),
        "fabricClaimMode": "per_slot_vf",
        "nvmeDevice": by_id(index),
        "numaNode": numa_of(index),
        "vcpus": 22,
        "memoryMiB": 65536,
        "mac": f"52:54:00:05:00:{index:02x}",
        "privateIp": f"10.100.5.{10 + index}",
    }
    return Slot.model_validate(fields | update)


def hgx_slots(updates: dict[int, dict[str, object]] | None = None) -> list[Slot]:
    updates = updates or {}
    return [slot(index, **updates.get(index, {})) for index in range(8)]


def states(validation: NodeValidation) -> list[ValidationState]:
    return [verdict.state for verdict in validation.slots]


# --- the healthy host ------------------------------------------------------------------------------------------------


def test_every_hgx_slot_is_valid() -> None:
    validation = validate_slots(hgx_slots(), hgx_host())
    assert [verdict.index for verdict in validation.slots] == list(range(8))
    assert states(validation) == [ValidationState.VALID] * 8
    assert all(verdict.checks == [] and verdict.messages == [] for verdict in validation.slots)
    assert validation.slices_blocked is None


def test_verdicts_come_in_slot_index_order_whatever_the_fleet_order() -> None:
    validation = validate_slots(list(reversed(hgx_slots())), hgx_host())
    assert [verdict.index for verdict in validation.slots] == list(range(8))


def test_an_unapproved_slot_is_still_checked() -> None:
    validation = validate_slots(hgx_slots({2: {"approved": False}}), hgx_host(skip_gpus=(2,)))
    assert validation.verdict(2).checks == [SlotCheck.GPU_ABSENT]


# --- fabric ---------------------------------------------------------------------------------------------------------


def test_j22u15_shared_parent_without_vfs_is_raw_only_and_blocks_slices() -> None:
    shared = {
        index: {
            "fabricClaimMode": "shared_parent",
            "fabricParentPci": pci("1a") if index < 4 else pci("9b"),
            "fabricVfPci": None,
        }
        for index in range(8)
    }
    validation = validate_slots(hgx_slots(shared), hgx_host(with_vfs=False))
    assert states(validation) == [ValidationState.RAW_ONLY] * 8
    assert all(verdict.checks == [SlotCheck.NO_PER_SLOT_VF] for verdict in validation.slots)
    assert "0000:1a:00.0" in validation.verdict(0).message and "shared_parent" in validation.verdict(0).message
    assert validation.slices_blocked == (
        "slots 0-7 share parent fabric devices (0000:1a:00.0 by slots 0-3; 0000:9b:00.0 by slots 4-7) with no "
        "per-slot VF: not schedulable for GPU VM slices until every slot has fabricClaimMode per_slot_vf and its own VF"
    )


def test_per_slot_vf_without_a_vf_address_is_no_per_slot_vf() -> None:
    validation = validate_slots(hgx_slots({5: {"fabricVfPci": None}}), hgx_host())
    assert validation.verdict(5).checks == [SlotCheck.NO_PER_SLOT_VF]
    assert "fabricVfPci" in validation.verdict(5).message and "0000:ba:00.0" in validation.verdict(5).message
    assert validation.slices_blocked is None  # the other seven are bundles


def test_several_slots_under_one_pf_each_with_its_own_vf_are_fine() -> None:
    extra = [vf(0, 2, iommu_group=200)]
    slots = hgx_slots({1: {"fabricParentPci": pci("1a"), "fabricVfPci": pci("1a", 2)}})
    validation = validate_slots(slots, hgx_host(extra_fabric=extra))
    assert states(validation) == [ValidationState.VALID] * 8
    assert validation.slices_blocked is None


def test_one_vf_declared_by_two_slots_makes_both_raw_only() -> None:
    slots = hgx_slots({1: {"fabricParentPci": pci("1a"), "fabricVfPci": pci("1a", 1)}})
    validation = validate_slots(slots, hgx_host())
    for index, other in ((0, 1), (1, 0)):
        verdict = validation.verdict(index)
        assert verdict.state is ValidationState.RAW_ONLY
        assert verdict.checks == [SlotCheck.VF_DECLARED_TWICE]
        assert verdict.message == f"fabric VF 0000:1a:00.1 is also declared by slot {other}"
    assert validation.slices_blocked is None


def test_a_vf_under_another_pf_is_not_a_child() -> None:
    extra = [vf(0, 2, iommu_group=200)]
    slots = hgx_slots({1: {"fabricVfPci": pci("1a", 2)}})  # parent still declared as 0000:3a:00.0
    verdict = validate_slots(slots, hgx_host(extra_fabric=extra)).verdict(1)
    assert verdict.state is ValidationState.RAW_ONLY
    assert verdict.checks == [SlotCheck.VF_NOT_CHILD]
    assert verdict.message == "fabric VF 0000:1a:00.2 belongs to 0000:1a:00.0, not the declared parent 0000:3a:00.0"


def test_an_absent_vf_and_a_pf_declared_as_vf_are_vf_absent() -> None:
    slots = hgx_slots({2: {"fabricVfPci": pci("4d", 5)}, 3: {"fabricVfPci": pci("5d")}})
    validation = validate_slots(slots, hgx_host())
    assert validation.verdict(2).checks == [SlotCheck.VF_ABSENT]
    assert validation.verdict(2).message == "fabric VF 0000:4d:00.5 is not on this host"
    assert validation.verdict(3).checks == [SlotCheck.VF_ABSENT]
    assert "0000:5d:00.0 is a physical function" in validation.verdict(3).message


def test_no_valid_slot_but_raw_ones_blocks_slices_without_a_shared_parent() -> None:
    validation = validate_slots(hgx_slots(), hgx_host(with_vfs=False))
    assert states(validation) == [ValidationState.RAW_ONLY] * 8
    assert validation.slices_blocked is not None
    assert "slots 0-7 are raw GPUs only (vf_absent)" in validation.slices_blocked


# --- GPU ---------------------------------------------------------------------------------------------------------------


def test_a_missing_gpu_makes_only_its_slot_invalid() -> None:
    validation = validate_slots(hgx_slots(), hgx_host(skip_gpus=(2,)))
    verdict = validation.verdict(2)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [SlotCheck.GPU_ABSENT]
    assert "GPU 0000:4b:00.0" in verdict.message
    assert [v.state for v in validation.slots if v.index != 2] == [ValidationState.VALID] * 7
    assert validation.slices_blocked is None


def test_a_gpu_on_the_nvidia_driver_is_not_vfio() -> None:
    host = hgx_host(gpu_update=lambda index: {"driver": "nvidia"} if index == 1 else {})
    verdict = validate_slots(hgx_slots(), host).verdict(1)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [SlotCheck.GPU_NOT_VFIO]
    assert verdict.message == "GPU 0000:3c:00.0 is bound to nvidia, not vfio-pci"


def test_an_unbound_gpu_is_not_vfio() -> None:
    host = hgx_host(gpu_update=lambda index: {"driver": None} if index == 1 else {})
    verdict = validate_slots(hgx_slots(), host).verdict(1)
    assert verdict.message == "GPU 0000:3c:00.0 is bound to no driver, not vfio-pci"


def test_a_host_problem_on_the_gpu_is_sysfs_unreadable() -> None:
    problem = HostProblem(path="/sys/bus/pci/devices/0000:3c:00.0/numa_node", message="EIO", device=pci("3c"))
    verdict = validate_slots(hgx_slots(), hgx_host(problems=[problem])).verdict(1)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [SlotCheck.SYSFS_UNREADABLE]
    assert "GPU 0000:3c:00.0" in verdict.message and "numa_node: EIO" in verdict.message


# --- IOMMU groups ------------------------------------------------------------------------------------------------------


def function(address: str, class_code: str, driver: str | None, group: int) -> PciFunction:
    return PciFunction(
        address=address, vendor_id="15b3", device_id="0000", class_code=class_code, driver=driver, iommu_group=group
    )


def test_an_iommu_group_shared_with_a_stranger_nic_is_shared() -> None:
    nic = function("0000:3d:00.0", "020000", "mlx5_core", 11)  # GPU 0000:3c:00.0 is group 11
    verdict = validate_slots(hgx_slots(), hgx_host(extra=[nic])).verdict(1)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [SlotCheck.IOMMU_GROUP_SHARED]
    assert "0000:3d:00.0 (mlx5_core" in verdict.message and "GPU 0000:3c:00.0" in verdict.message


def test_a_bridge_in_the_gpu_iommu_group_is_fine() -> None:
    bridge = function("0000:3b:00.0", "060400", "pcieport", 11)
    assert validate_slots(hgx_slots(), hgx_host(extra=[bridge])).verdict(1).state is ValidationState.VALID


def test_the_gpu_audio_function_on_snd_hda_intel_is_not_vfio() -> None:
    audio = function("0000:3c:00.1", "040300", "snd_hda_intel", 11)
    verdict = validate_slots(hgx_slots(), hgx_host(extra=[audio])).verdict(1)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [SlotCheck.IOMMU_GROUP_NOT_VFIO]
    assert (
        verdict.message == "0000:3c:00.1 in IOMMU group 11 of GPU 0000:3c:00.0 is bound to snd_hda_intel, not vfio-pci"
    )


def test_the_gpu_audio_function_on_vfio_or_no_driver_is_fine() -> None:
    for driver in ("vfio-pci", None):
        audio = function("0000:3c:00.1", "040300", driver, 11)
        assert validate_slots(hgx_slots(), hgx_host(extra=[audio])).verdict(1).state is ValidationState.VALID


def test_the_slot_own_nvme_controller_in_the_gpu_group_breaks_passthrough() -> None:
    """The NVMe is attached as a host block device, so its controller stays on the host's nvme driver: VFIO cannot
    take a group that holds it, even for the slot's own disk."""
    host = hgx_host()
    groups = dict(host.iommu_groups) | {11: [pci("3c"), pci("3e")]}
    verdict = validate_slots(hgx_slots(), host.model_copy(update={"iommu_groups": groups})).verdict(1)
    assert verdict.state is ValidationState.INVALID and verdict.checks == [SlotCheck.IOMMU_GROUP_SHARED]


def test_a_gpu_without_an_iommu_group_is_missing() -> None:
    host = hgx_host(gpu_update=lambda index: {"iommu_group": None} if index == 1 else {})
    verdict = validate_slots(hgx_slots(), host).verdict(1)
    assert verdict.checks == [SlotCheck.IOMMU_GROUP_MISSING]
    assert "GPU 0000:3c:00.0" in verdict.message


def test_the_vf_iommu_group_is_checked_too() -> None:
    stranger = function("0000:3b:00.0", "020000", "mlx5_core", 50 + 8 + 1)  # VF 0000:3a:00.1's group
    verdict = validate_slots(hgx_slots(), hgx_host(extra=[stranger])).verdict(1)
    assert verdict.checks == [SlotCheck.IOMMU_GROUP_SHARED]
    assert "fabric VF 0000:3a:00.1" in verdict.message and "0000:3b:00.0" in verdict.message


# --- NVMe and NUMA -----------------------------------------------------------------------------------------------------


def test_a_mounted_nvme_is_in_use() -> None:
    host = hgx_host(nvme_update=lambda index: {"in_use": ["mounted at /var/lib/docker"]} if index == 3 else {})
    verdict = validate_slots(hgx_slots(), host).verdict(3)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [SlotCheck.NVME_IN_USE]
    assert verdict.message == f"NVMe {by_id(3)} (/dev/nvme3n1) is in use on the host: mounted at /var/lib/docker"


def test_an_nvme_no_namespace_answers_to_is_absent() -> None:
    verdict = validate_slots(hgx_slots({4: {"nvmeDevice": "/dev/nvme42n1"}}), hgx_host()).verdict(4)
    assert verdict.checks == [SlotCheck.NVME_ABSENT]
    assert verdict.message == "NVMe /dev/nvme42n1 is not on this host"


def test_an_nvme_is_known_by_path_name_or_wwid() -> None:
    references = {0: "/dev/nvme0n1", 1: "nvme1n1", 2: "eui.0025388b00000002"}
    slots = hgx_slots({index: {"nvmeDevice": reference} for index, reference in references.items()})
    assert states(validate_slots(slots, hgx_host())) == [ValidationState.VALID] * 8


def test_a_numa_node_the_firmware_does_not_give_is_no_mismatch() -> None:
    host = hgx_host(
        gpu_update=lambda index: {"numa_node": None}, nvme_update=lambda index: {"numa_node": None} if index else {}
    )
    assert states(validate_slots(hgx_slots(), host)) == [ValidationState.VALID] * 8


def test_numa_mismatch_is_reported_once_naming_every_device() -> None:
    host = hgx_host(
        gpu_update=lambda index: {"numa_node": 1} if index == 0 else {},
        nvme_update=lambda index: {"numa_node": 1} if index == 0 else {},
    )
    verdict = validate_slots(hgx_slots(), host).verdict(0)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [SlotCheck.NUMA_MISMATCH]
    assert verdict.message == (
        "GPU 0000:1b:00.0 is on NUMA node 1, not the slot's NUMA node 0; "
        f"NVMe {by_id(0)} (/dev/nvme0n1) is on NUMA node 1, not the slot's NUMA node 0"
    )


def test_a_vf_on_another_numa_node_is_a_mismatch() -> None:
    verdict = validate_slots(hgx_slots({0: {"numaNode": 1}}), hgx_host()).verdict(0)
    assert verdict.checks == [SlotCheck.NUMA_MISMATCH]
    assert "GPU 0000:1b:00.0" in verdict.message and "fabric VF 0000:1a:00.1" in verdict.message


# --- several failures --------------------------------------------------------------------------------------------------


def test_every_failed_check_is_listed_most_severe_first_with_one_message_each() -> None:
    problem = HostProblem(path="/sys/bus/pci/devices/0000:dc:00.0/resource", message="unparsable", device=pci("dc"))
    host = hgx_host(
        gpu_update=lambda index: {"driver": "nvidia"} if index == 7 else {},
        nvme_update=lambda index: {"in_use": ["held by dm-0"]} if index == 7 else {},
        problems=[problem],
    )
    slots = hgx_slots({7: {"fabricClaimMode": "shared_parent", "fabricVfPci": None, "numaNode": 0}})
    verdict = validate_slots(slots, host).verdict(7)
    assert verdict.state is ValidationState.INVALID
    assert verdict.checks == [
        SlotCheck.SYSFS_UNREADABLE,
        SlotCheck.GPU_NOT_VFIO,
        SlotCheck.NVME_IN_USE,
        SlotCheck.NUMA_MISMATCH,
        SlotCheck.NO_PER_SLOT_VF,
    ]
    assert len(verdict.messages) == len(verdict.checks)
    assert verdict.reason is SlotCheck.SYSFS_UNREADABLE
    assert all(("0000:" in message or "/dev/" in message) for message in verdict.messages)


def test_a_namespace_sharing_its_controller_is_refused() -> None:
    """A controller split into namespaces: the wipe's `nvme format` may erase every namespace of it."""
    host = hgx_host()
    first = host.nvme[0]
    sibling = first.model_copy(update={"name": "nvme0n2", "wwid": "eui.sibling", "by_id": []})
    verdict = validate_slots(hgx_slots(), host.model_copy(update={"nvme": [*host.nvme, sibling]})).verdict(0)
    assert verdict.state is ValidationState.INVALID and verdict.checks == [SlotCheck.NVME_SHARED_CONTROLLER]
    assert "nvme0n2" in (verdict.message or "")
