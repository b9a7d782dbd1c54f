"""Drafting a fleet slot block from a discovered host (`suggest_slots`), and the round trip through the fleet loader
and `validate_slots`."""

from __future__ import annotations

from fleet.node import Node, Slot
from scheduler.host.checks import SlotCheck, ValidationState
from scheduler.host.inventory import FabricDevice, Gpu, HostInventory
from scheduler.host.suggest import suggest_slots
from scheduler.host.validate import validate_slots
from tests.scheduler.host.test_host_validation import (
    GPU_BUSES,
    PF_BUSES,
    by_id,
    gpu,
    hgx_host,
    inventory,
    namespace,
    pci,
    pf,
    vf,
)

KEYS = {
    "index",
    "gpuPci",
    "fabricParentPci",
    "fabricVfPci",
    "fabricClaimMode",
    "nvmeDevice",
    "numaNode",
    "vcpus",
    "memoryMiB",
    "approved",
}
# (96 CPUs - 4) / 4 GPUs = 23 -> 22 (even); (1 TiB - 8 GiB) / 4 = 254 GiB
CELL_SHARE_VCPUS = 22
CELL_SHARE_MIB = 254 * 1024


def loaded(block: list[dict[str, object]]) -> list[Slot]:
    return [Slot.model_validate(entry) for entry in block]


def test_hgx_host_pairs_each_gpu_with_its_nearest_same_numa_vf_and_nvme() -> None:
    block = suggest_slots(hgx_host())
    assert len(block) == 8
    for index, entry in enumerate(block):
        assert set(entry) == KEYS  # no mac / privateIp: the operator fills those
        assert entry == {
            "index": index,
            "gpuPci": pci(GPU_BUSES[index]),
            "fabricParentPci": pci(PF_BUSES[index]),
            "fabricVfPci": pci(PF_BUSES[index], 1),
            "fabricClaimMode": "per_slot_vf",
            "nvmeDevice": by_id(index),
            "numaNode": 0 if index < 4 else 1,
            "vcpus": CELL_SHARE_VCPUS,
            "memoryMiB": CELL_SHARE_MIB,
            "approved": True,
        }


def test_hgx_block_round_trips_through_the_fleet_loader_and_validates() -> None:
    host = hgx_host()
    block = suggest_slots(host)
    node = Node.model_validate({"name": "j22u05", "cpus": 192, "numaNodes": 2, "slots": block})
    validation = validate_slots(node.slots, host)
    assert [verdict.state for verdict in validation.slots] == [ValidationState.VALID] * 8
    assert validation.slices_blocked is None


def test_the_draft_does_not_depend_on_discovery_order() -> None:
    host = hgx_host()
    shuffled = host.model_copy(
        update={
            "gpus": list(reversed(host.gpus)),
            "fabric": list(reversed(host.fabric)),
            "nvme": list(reversed(host.nvme)),
        }
    )
    assert suggest_slots(shuffled) == suggest_slots(host)


def test_j22u15_host_without_vfs_gets_shared_parent_slots_that_block_slices() -> None:
    host = hgx_host(with_vfs=False)
    block = suggest_slots(host)
    assert [entry["fabricClaimMode"] for entry in block] == ["shared_parent"] * 8
    assert [entry["fabricParentPci"] for entry in block] == [pci(bus) for bus in PF_BUSES]
    assert all(entry["fabricVfPci"] is None and entry["approved"] is True for entry in block)
    validation = validate_slots(loaded(block), host)
    assert [verdict.checks for verdict in validation.slots] == [[SlotCheck.NO_PER_SLOT_VF]] * 8
    assert [verdict.state for verdict in validation.slots] == [ValidationState.RAW_ONLY] * 8
    assert validation.slices_blocked is not None


def test_a_host_without_fabric_gets_claim_mode_none() -> None:
    host = inventory([gpu(index) for index in range(8)], [], [namespace(index) for index in range(8)])
    block = suggest_slots(host)
    assert all(entry["fabricClaimMode"] == "none" and entry["fabricParentPci"] is None for entry in block)
    assert validate_slots(loaded(block), host).slices_blocked is not None


def test_vfs_spread_over_pfs_when_there_are_enough() -> None:
    """Two NUMA-0 PFs with four VFs each: the four NUMA-0 GPUs get two VFs of each, nearest first."""
    fabric: list[FabricDevice] = [pf(0, vfs=4), pf(3, vfs=4)]
    fabric += [vf(pf_index, function) for pf_index in (0, 3) for function in range(1, 5)]
    host = inventory([gpu(index) for index in range(4)], fabric, [namespace(index) for index in range(4)])
    assert [entry["fabricVfPci"] for entry in suggest_slots(host)] == [
        "0000:1a:00.1",  # GPU 1b: nearest PF
        "0000:5d:00.1",  # GPU 3c: 1a is already used once, 5d not yet
        "0000:5d:00.2",  # GPU 4b: both used once, 5d is nearer
        "0000:1a:00.2",  # GPU 5c: 5d is used twice
    ]


def test_a_vf_on_the_gpu_numa_node_beats_a_nearer_bus_on_the_other() -> None:
    far_same_numa = vf(0, address="0000:60:00.1", parent="0000:60:00.0", numa_node=0)
    near_other_numa = vf(0, address="0000:1c:00.1", parent="0000:1c:00.0", numa_node=1, iommu_group=201)
    host = inventory([gpu(0)], [near_other_numa, far_same_numa], [namespace(0)])
    assert suggest_slots(host)[0]["fabricVfPci"] == "0000:60:00.1"


def test_a_namespace_in_use_is_never_suggested() -> None:
    host = hgx_host(nvme_update=lambda index: {"in_use": ["mounted at /"]} if index == 0 else {})
    block = suggest_slots(host)
    devices = [entry["nvmeDevice"] for entry in block]
    assert by_id(0) not in devices
    assert devices[:3] == [by_id(1), by_id(2), by_id(3)]  # NUMA 0 namespaces, nearest bus first
    assert devices[3] == by_id(4)  # NUMA 0 has none left: the nearest on NUMA 1 ...
    assert block[3]["approved"] is False  # ... which would fail validation (NUMA mismatch)
    assert devices[7] is None and block[7]["approved"] is False  # eight GPUs, seven free namespaces


def test_a_namespace_without_by_id_links_is_named_by_its_dev_path() -> None:
    host = hgx_host(nvme_update=lambda index: {"by_id": []} if index == 2 else {})
    assert suggest_slots(host)[2]["nvmeDevice"] == "/dev/nvme2n1"


def test_a_gpu_not_on_vfio_is_suggested_but_not_approved() -> None:
    host = hgx_host(gpu_update=lambda index: {"driver": "nvidia"} if index == 5 else {})
    block = suggest_slots(host)
    assert block[5]["gpuPci"] == pci(GPU_BUSES[5])
    assert [entry["approved"] for entry in block] == [True] * 5 + [False] + [True] * 2


def test_explicit_sizes_override_the_numa_split() -> None:
    block = suggest_slots(hgx_host(), vcpus_per_slot=16, memory_mib_per_slot=131072)
    assert {(entry["vcpus"], entry["memoryMiB"]) for entry in block} == {(16, 131072)}
    only_vcpus = suggest_slots(hgx_host(), vcpus_per_slot=16)
    assert {(entry["vcpus"], entry["memoryMiB"]) for entry in only_vcpus} == {(16, CELL_SHARE_MIB)}


def test_the_numa_split_follows_the_gpus_on_each_cell() -> None:
    """Three GPUs on cell 0 and one on cell 1: cell 0 is split three ways, cell 1 goes to its one GPU."""
    gpus = [gpu(0), gpu(1), gpu(2), gpu(4)]
    host = inventory(gpus, [], [namespace(index) for index in (0, 1, 2, 4)])
    sizes = [(entry["vcpus"], entry["memoryMiB"]) for entry in suggest_slots(host)]
    assert sizes == [(30, 338 * 1024)] * 3 + [(92, 1016 * 1024)]  # (96-4)/3 = 30.67 -> 30; (1024-8)/3 GiB = 338.67


def test_a_gpu_without_a_numa_node_shares_the_whole_host() -> None:
    gpus = [gpu(0, numa_node=None), gpu(1, numa_node=None)]
    host = inventory(gpus, [], [namespace(0), namespace(1)])
    block = suggest_slots(host)
    assert [entry["numaNode"] for entry in block] == [0, 0]
    assert [(entry["vcpus"], entry["memoryMiB"]) for entry in block] == [(92, 1016 * 1024)] * 2  # (192 - 8) / 2


def test_a_host_without_numa_cells_gets_the_smallest_sizes() -> None:
    host = inventory([gpu(0)], [], [namespace(0)]).model_copy(update={"numa": []})
    entry = suggest_slots(host)[0]
    assert (entry["vcpus"], entry["memoryMiB"]) == (2, 1024)


def test_no_gpus_no_slots() -> None:
    assert suggest_slots(HostInventory()) == []


def test_gpus_come_in_pci_address_order() -> None:
    gpus: list[Gpu] = [gpu(index) for index in (7, 0, 3)]
    host = inventory(gpus, [], [namespace(index) for index in (7, 0, 3)])
    assert [entry["gpuPci"] for entry in suggest_slots(host)] == [pci(GPU_BUSES[i]) for i in (0, 3, 7)]
