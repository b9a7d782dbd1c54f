"""What a node agent discovered on its host: the facts an operator and the node scheduler need, nothing more.

Discovery is PCI-level (sysfs), because a GPU bound to `vfio-pci`, as every passthrough GPU is, is invisible to
NVML and `nvidia-smi`; NVML only adds detail for GPUs the host driver still holds. A fact the host could not give
(no NUMA node from firmware, IOMMU off, an unreadable sysfs entry) is a `None` or a `HostProblem`, never a crash:
validation turns it into a slot reason.

PCI addresses are always `dddd:bb:dd.f`, lower case, 4-digit domain (sysfs and libvirt style); anything with an
8-digit domain (nvidia-smi's `pci_bus_id`) is normalised by `contracts.pci.normalise_pci` before it enters these
models.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

# What one host can have, with room to spare: every reported string and list is bounded by these, so a node token
# cannot make the control plane store (and `GET /v1/nodes` show) megabytes for one host. Discovery never
# reaches them on a real host: each says where it comes from.
MAX_PCI_FUNCTIONS = 4096  # an 8-GPU HGX host lists about 600 functions (bridges, NVSwitches, NICs, NVMe); 16 fabric
#                           PFs with every SR-IOV VF mlx5 allows (127 each) add about 2,000 more
MAX_GPUS = 64  # 8 on an HGX/DGX board, 16 on the densest (HGX-2); 20 in the largest PCIe chassis
MAX_NVME = 256  # 24 to 36 U.2/E1.S bays in a 2U host, a few namespaces each
MAX_NUMA_CELLS = 64  # 8 on a two-socket host at NPS4; sub-NUMA clustering on an 8-socket host gives 32
MAX_CPUS = 8192  # the largest NR_CPUS x86-64 Linux is built with: no cell, nor all cells together, lists more
MAX_FUNCTIONS_PER_DEVICE = 255  # a PCI device has 8 functions, 256 with ARI: a GPU's other functions
MAX_DEVICE_NAMES = 1024  # a fabric PF's netdevs in switchdev mode: itself and one representor per VF (mlx5: 127),
#                          and its RDMA devices; an NVMe namespace's by-id links (a handful) and reasons it is in use
MAX_PROBLEMS = 256  # discovery keeps at most this many and says how many more there were
MAX_NAME = 64  # a kernel driver (MODULE_NAME_LEN 56), netdev (IFNAMSIZ 16), RDMA device (IB_DEVICE_NAME_MAX 64) or
#                block device name (DISK_NAME_LEN 32)
MAX_TEXT = 255  # a product name (NVML's buffer is 96), a serial (NVMe's is 20), a wwid (about 150 as hex), a host
#                 name (253 as an FQDN)
MAX_PATH = 4096  # PATH_MAX: a sysfs path, a /dev/disk/by-id link, a mount point
MAX_MESSAGE = MAX_PATH + 64  # a problem or an in-use reason: a sentence that may quote one path
MAX_HOST_BYTES = 2 * 1024 * 1024  # the whole inventory as JSON: 16 GPUs, 16 PFs with all 127 VFs enabled and 600
#                                   other functions is 1.09 MB (tests/api/test_api_report_bounds.py); the bounds
#                                   per list, multiplied out, would allow far more

PciAddress = Annotated[str, StringConstraints(max_length=16)]  # dddd:bb:dd.f is 12; 16 with nvidia-smi's 8-digit domain
HexId = Annotated[str, StringConstraints(max_length=8)]  # a vendor or device id is 4 hex digits, a class code 6
DeviceName = Annotated[str, StringConstraints(max_length=MAX_NAME)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
PathText = Annotated[str, StringConstraints(max_length=MAX_PATH)]
Message = Annotated[str, StringConstraints(max_length=MAX_MESSAGE)]


def pci_device(address: str) -> str:
    """The PCI device of a function: `0000:3c:00.1` -> `0000:3c:00` (a GPU and its audio function share it)."""
    return address.rsplit(".", 1)[0]


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PciFunction(Model):
    """One PCI function as sysfs describes it."""

    address: PciAddress
    vendor_id: HexId  # 4 hex digits, lower case, no 0x: "10de"
    device_id: HexId  # "2335"
    class_code: HexId  # 6 hex digits: "030200" (3D controller), "020700" (InfiniBand), "010802" (NVMe)
    driver: DeviceName | None = None  # the bound kernel driver ("vfio-pci", "nvidia", "mlx5_core"), None when unbound
    numa_node: int | None = None  # None when the firmware gives none (sysfs reads -1)
    iommu_group: int | None = None  # None when the IOMMU is off or the group is not visible

    @property
    def is_bridge(self) -> bool:
        return self.class_code.startswith("0604")


class GpuDetailSource(StrEnum):
    PCI_IDS = "pci-ids"  # Berth's table of NVIDIA device ids: all a vfio-bound GPU offers
    NVML = "nvml"  # the host driver holds the GPU and NVML answered
    NVIDIA_SMI = "nvidia-smi"  # a recorded `nvidia-smi -q -x`


class Gpu(PciFunction):
    product: Text  # "NVIDIA H200", or "NVIDIA 10de:xxxx" for a device id Berth does not know
    memory_mib: int | None = None
    detail_source: GpuDetailSource = GpuDetailSource.PCI_IDS
    # The other functions of the same PCI device (audio, ...).
    functions: list[PciAddress] = Field(default_factory=list, max_length=MAX_FUNCTIONS_PER_DEVICE)


class FabricRole(StrEnum):
    PF = "pf"  # a physical function (the parent BF/IB/RDMA device)
    VF = "vf"  # an SR-IOV virtual function of a PF


class FabricDevice(PciFunction):
    """An IB/RDMA or high-speed Ethernet function (Mellanox/NVIDIA networking), PF or SR-IOV VF."""

    role: FabricRole
    parent: PciAddress | None = None  # a VF's PF (sysfs `physfn`)
    vfs: list[PciAddress] = Field(default_factory=list, max_length=MAX_PCI_FUNCTIONS)  # a PF's VFs (`virtfn*`)
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    netdevs: list[DeviceName] = Field(default_factory=list, max_length=MAX_DEVICE_NAMES)  # e.g. ["ibp59s0"]
    rdma_devices: list[DeviceName] = Field(default_factory=list, max_length=MAX_DEVICE_NAMES)  # e.g. ["mlx5_0"]


class NvmeNamespace(Model):
    """A block device of an NVMe controller, keyed by a stable identity rather than by its by-id name (those changed
    between systemd versions)."""

    name: DeviceName  # "nvme0n1"
    wwid: Text | None = None  # /sys/block/<name>/wwid: the stable identity
    serial: Text | None = None  # the controller's serial
    by_id: list[PathText] = Field(default_factory=list, max_length=MAX_DEVICE_NAMES)  # /dev/disk/by-id/... links
    size_bytes: int | None = None
    controller_pci: PciAddress | None = None
    numa_node: int | None = None
    # Why it is not free: "mounted at /", "held by dm-0", ...
    in_use: list[Message] = Field(default_factory=list, max_length=MAX_DEVICE_NAMES)

    @property
    def device_path(self) -> str:
        return f"/dev/{self.name}"

    def known_as(self, reference: str) -> bool:
        """Whether an operator's reference (a by-id path, `/dev/nvme0n1`, or the wwid) names this namespace."""
        return (
            reference in self.by_id
            or reference == self.device_path
            or reference == self.name
            or (self.wwid is not None and reference == self.wwid)
        )


class NumaCell(Model):
    id: int
    cpus: list[int] = Field(default_factory=list, max_length=MAX_CPUS)
    memory_mib: int = 0


class HostProblem(Model):
    """A sysfs entry that could not be read or made sense of. Reported, never fatal."""

    path: PathText
    message: Message
    device: DeviceName | None = None  # the PCI address or block device it concerns, when known


class HostInventory(Model):
    """Everything discovery found on one host. `topology_hash` identifies it: an agent reports the whole inventory
    only when the hash moves."""

    hostname: Text | None = None
    # The VM runtime as the agent runs it: hypervisor, accelerator (KVM or TCG, and why) and whether GPUs pass
    # through (agent/drivers.py, `VmDriver.runtime`). Not part of the topology's hash: it describes, it is no device.
    vm_runtime: Text | None = None
    gpus: list[Gpu] = Field(default_factory=list, max_length=MAX_GPUS)
    fabric: list[FabricDevice] = Field(default_factory=list, max_length=MAX_PCI_FUNCTIONS)
    nvme: list[NvmeNamespace] = Field(default_factory=list, max_length=MAX_NVME)
    numa: list[NumaCell] = Field(default_factory=list, max_length=MAX_NUMA_CELLS)
    # group -> every PCI function in it
    iommu_groups: dict[int, list[PciAddress]] = Field(
        default_factory=dict,
        max_length=MAX_PCI_FUNCTIONS,
        json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}},  # a group's number, as /sys/kernel/iommu_groups
    )
    # every function named by an IOMMU group
    pci_functions: dict[PciAddress, PciFunction] = Field(default_factory=dict, max_length=MAX_PCI_FUNCTIONS)
    problems: list[HostProblem] = Field(default_factory=list, max_length=MAX_PROBLEMS)

    @model_validator(mode="after")
    def _one_host(self) -> HostInventory:
        """The lists nested in others, counted over the whole host: each bound per list alone would let a host list
        4,096 PFs of 4,096 VFs each. A function is in one IOMMU group and a VF under one PF, a CPU in one cell."""
        totals = {
            "PCI functions in IOMMU groups": (sum(map(len, self.iommu_groups.values())), MAX_PCI_FUNCTIONS),
            "VFs of fabric PFs": (sum(len(device.vfs) for device in self.fabric), MAX_PCI_FUNCTIONS),
            "other functions of GPUs": (sum(len(gpu.functions) for gpu in self.gpus), MAX_PCI_FUNCTIONS),
            "CPUs in NUMA cells": (sum(len(cell.cpus) for cell in self.numa), MAX_CPUS),
            "fabric netdevs and RDMA devices": (
                sum(len(device.netdevs) + len(device.rdma_devices) for device in self.fabric),
                2 * MAX_PCI_FUNCTIONS,
            ),
            "NVMe by-id links and in-use reasons": (
                sum(len(namespace.by_id) + len(namespace.in_use) for namespace in self.nvme),
                4 * MAX_DEVICE_NAMES,  # four by-id links to each of MAX_NVME namespaces, and as many reasons again
            ),
        }
        for what, (count, bound) in totals.items():
            if count > bound:
                raise ValueError(f"the host lists {count} {what}; a host has at most {bound}")
        return self

    def topology_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json(exclude={"hostname", "vm_runtime"}).encode()).hexdigest()[:16]

    def gpu(self, address: str) -> Gpu | None:
        return next((gpu for gpu in self.gpus if gpu.address == address), None)

    def fabric_device(self, address: str) -> FabricDevice | None:
        return next((device for device in self.fabric if device.address == address), None)

    def problems_for(self, device: str) -> list[HostProblem]:
        return [problem for problem in self.problems if problem.device == device]
