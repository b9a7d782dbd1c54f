"""A first slot block for the fleet file, drafted from what discovery found, so an operator edits rather than types.

Slot approval comes from each node's own topology, not from a profile copied between hosts (docs/seeds.md, "Slot
approval from each host's own topology"). This drafts that topology as slots; the operator still reviews it, adds
each slot's MAC and private IP, and approves it.

How devices are paired, GPUs taken in PCI address order (deterministic, so the same host always drafts the same
block):

- fabric: the nearest free SR-IOV VF: same NUMA node first, then VFs of the PF fewest slots use so far (GPUs spread
  over the NICs, as rail-optimised HGX hosts are cabled), then PCI distance (same domain, smallest bus difference),
  then address. A GPU left without a VF gets `shared_parent` on its nearest PF when the host has one (a raw GPU,
  never a slice: docs/seeds.md, "A slice needs its own fabric VF"), `none` otherwise.
- NVMe: the nearest namespace nothing on the host uses (never a mounted or LVM/dm/md-held one): same NUMA node
  first, then PCI bus distance of its controller, then name. `nvmeDevice` is its first by-id link (what operators
  read), or `/dev/<name>` when it has none.
- CPU and memory: each NUMA cell's CPUs and memory, less `HOST_CPUS_PER_CELL` CPUs and `HOST_MEMORY_MIB_PER_CELL`
  MiB kept back for the host (agent, libvirt, QEMU overhead), split evenly among the GPUs on that cell, rounded
  down to an even number of vCPUs and a whole GiB, never below 2 vCPUs and 1 GiB. A GPU whose NUMA cell is unknown
  gets an even share of the whole host. `vcpus_per_slot` and `memory_mib_per_slot` override either.
- `approved`: False when the drafted slot would be unusable as it stands (`validate_slots` finds it INVALID: a GPU
  not bound to vfio-pci, an IOMMU group it shares, a NUMA mismatch, ...) or no free NVMe was left for it; the slot
  is still drafted, since the operator may rebind the driver or free a disk. Slots that only lack a per-slot VF
  stay approved: they count as raw GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from fleet.node import FabricClaimMode, Slot
from scheduler.host.checks import ValidationState
from scheduler.host.inventory import FabricDevice, FabricRole, Gpu, HostInventory, NumaCell, NvmeNamespace
from scheduler.host.validate import validate_slots

HOST_CPUS_PER_CELL = 4
HOST_MEMORY_MIB_PER_CELL = 8 * 1024
MIN_VCPUS = 2
MIB_PER_GIB = 1024


def suggest_slots(
    host: HostInventory, *, vcpus_per_slot: int | None = None, memory_mib_per_slot: int | None = None
) -> list[dict[str, object]]:
    """One slot per GPU of the host, in GPU PCI address order, as camelCase fleet-file dicts (no mac/privateIp)."""
    gpus = sorted(host.gpus, key=lambda gpu: gpu.address)
    vfs = _pair_vfs(gpus, host)
    namespaces = _pair_namespaces(gpus, host)
    blocks = [
        _block(index, gpu, host, gpus, vfs[index], namespaces[index], vcpus_per_slot, memory_mib_per_slot)
        for index, gpu in enumerate(gpus)
    ]
    return _approve(blocks, namespaces, host)


def _block(
    index: int,
    gpu: Gpu,
    host: HostInventory,
    gpus: Sequence[Gpu],
    vf: FabricDevice | None,
    namespace: NvmeNamespace | None,
    vcpus: int | None,
    memory_mib: int | None,
) -> dict[str, object]:
    parent = vf.parent if vf is not None else _nearest_pf(gpu, host)
    share_vcpus, share_memory = _share(gpu, gpus, host)
    return {
        "index": index,
        "gpuPci": gpu.address,
        "fabricParentPci": parent,
        "fabricVfPci": vf.address if vf is not None else None,
        "fabricClaimMode": str(_claim_mode(vf, parent)),
        "nvmeDevice": _nvme_reference(namespace) if namespace is not None else None,
        "numaNode": gpu.numa_node if gpu.numa_node is not None else 0,
        "vcpus": vcpus if vcpus is not None else share_vcpus,
        "memoryMiB": memory_mib if memory_mib is not None else share_memory,
    }


def _claim_mode(vf: FabricDevice | None, parent: str | None) -> FabricClaimMode:
    if vf is not None:
        return FabricClaimMode.PER_SLOT_VF
    return FabricClaimMode.SHARED_PARENT if parent else FabricClaimMode.NONE


def _approve(
    blocks: list[dict[str, object]], namespaces: Sequence[NvmeNamespace | None], host: HostInventory
) -> list[dict[str, object]]:
    """Run the draft through the same validation the agent will apply, so nothing unusable is drafted as approved."""
    validation = validate_slots([Slot.model_validate(block) for block in blocks], host)
    approved = [
        verdict.state is not ValidationState.INVALID and namespaces[verdict.index] is not None
        for verdict in validation.slots
    ]
    return [{**block, "approved": ok} for block, ok in zip(blocks, approved, strict=True)]


# --- pairing ------------------------------------------------------------------------------------------------------


def _pair_vfs(gpus: Sequence[Gpu], host: HostInventory) -> list[FabricDevice | None]:
    free = [device for device in host.fabric if device.role is FabricRole.VF]
    uses: Counter[str] = Counter()  # slots per PF so far
    paired: list[FabricDevice | None] = []
    for gpu in gpus:
        vf = min(
            free,
            key=lambda candidate: (
                _numa_rank(gpu.numa_node, candidate.numa_node),
                uses[_pf(candidate)],
                _distance(gpu.address, candidate.address),
                candidate.address,
            ),
            default=None,
        )
        if vf is not None:
            free.remove(vf)
            uses[_pf(vf)] += 1
        paired.append(vf)
    return paired


def _pair_namespaces(gpus: Sequence[Gpu], host: HostInventory) -> list[NvmeNamespace | None]:
    free = [namespace for namespace in host.nvme if not namespace.in_use]
    paired: list[NvmeNamespace | None] = []
    for gpu in gpus:
        namespace = min(
            free,
            key=lambda ns: (
                _numa_rank(gpu.numa_node, ns.numa_node),
                _distance(gpu.address, ns.controller_pci),
                ns.name,
            ),
            default=None,
        )
        if namespace is not None:
            free.remove(namespace)
        paired.append(namespace)
    return paired


def _nearest_pf(gpu: Gpu, host: HostInventory) -> str | None:
    """The parent a GPU without a VF would share: context for the operator, never a concurrency approval."""
    pfs = [device for device in host.fabric if device.role is FabricRole.PF]
    nearest = min(
        pfs,
        key=lambda pf: (_numa_rank(gpu.numa_node, pf.numa_node), _distance(gpu.address, pf.address), pf.address),
        default=None,
    )
    return nearest.address if nearest is not None else None


def _pf(vf: FabricDevice) -> str:
    return vf.parent or vf.address


def _numa_rank(gpu_numa: int | None, device_numa: int | None) -> int:
    return 0 if gpu_numa == device_numa else 1


def _distance(a: str, b: str | None) -> tuple[int, int]:
    """PCI distance: another domain (or an unknown address) is always farther than any bus in the same domain."""
    if b is None:
        return (2, 0)
    domain_a, bus_a = a.split(":")[:2]
    domain_b, bus_b = b.split(":")[:2]
    return (0 if domain_a == domain_b else 1, abs(int(bus_a, 16) - int(bus_b, 16)))


def _nvme_reference(namespace: NvmeNamespace) -> str:
    return namespace.by_id[0] if namespace.by_id else namespace.device_path


# --- sizes --------------------------------------------------------------------------------------------------------


def _share(gpu: Gpu, gpus: Sequence[Gpu], host: HostInventory) -> tuple[int, int]:
    """vCPUs and MiB for one GPU's slot: its cell split among the cell's GPUs, or the whole host among all GPUs."""
    cell = next((cell for cell in host.numa if cell.id == gpu.numa_node), None)
    if cell is not None:
        return _split([cell], sum(1 for other in gpus if other.numa_node == cell.id))
    return _split(host.numa, len(gpus))


def _split(cells: Sequence[NumaCell], gpus: int) -> tuple[int, int]:
    cpus = sum(len(cell.cpus) - HOST_CPUS_PER_CELL for cell in cells)
    memory = sum(cell.memory_mib - HOST_MEMORY_MIB_PER_CELL for cell in cells)
    vcpus = cpus // gpus // 2 * 2
    memory_mib = memory // gpus // MIB_PER_GIB * MIB_PER_GIB
    return max(MIN_VCPUS, vcpus), max(MIB_PER_GIB, memory_mib)
