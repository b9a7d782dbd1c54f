"""What a node agent discovered on its host: the facts an operator and the node scheduler need, nothing more.

Discovery is PCI-level (sysfs), because a GPU bound to `vfio-pci`, as every passthrough GPU is, is invisible to
NVML and `nvidia-smi`; NVML only adds detail for GPUs the host driver still holds. A fact the host could not give
(no NUMA node from firmware, IOMMU off, an unreadable sysfs entry) is a `None` or a `HostProblem`, never a crash:
validation turns it into a slot reason.

PCI addresses are always `dddd:bb:dd.f`, lower case, 4-digit domain (sysfs and libvirt style); anything with an
8-digit domain (nvidia-smi's `pci_bus_id`) is normalised by `normalise_pci` before it enters these models.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

_PCI = re.compile(r"^(?:[0-9a-fA-F]{4}|[0-9a-fA-F]{8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def normalise_pci(address: str) -> str:
    """`00000000:3C:00.0` (nvidia-smi) or `0000:3c:00.0` (sysfs) -> `0000:3c:00.0`. Raises ValueError otherwise."""
    value = address.strip()
    if not _PCI.match(value):
        raise ValueError(f"{address!r} is not a PCI address")
    domain, rest = value.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def pci_device(address: str) -> str:
    """The PCI device of a function: `0000:3c:00.1` -> `0000:3c:00` (a GPU and its audio function share it)."""
    return address.rsplit(".", 1)[0]


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PciFunction(Model):
    """One PCI function as sysfs describes it."""

    address: str
    vendor_id: str  # 4 hex digits, lower case, no 0x: "10de"
    device_id: str  # "2335"
    class_code: str  # 6 hex digits: "030200" (3D controller), "020700" (InfiniBand), "010802" (NVMe)
    driver: str | None = None  # the bound kernel driver ("vfio-pci", "nvidia", "mlx5_core"), None when unbound
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
    product: str  # "NVIDIA H200", or "NVIDIA 10de:xxxx" for a device id Berth does not know
    memory_mib: int | None = None
    detail_source: GpuDetailSource = GpuDetailSource.PCI_IDS
    functions: list[str] = Field(default_factory=list)  # the other functions of the same PCI device (audio, ...)


class FabricRole(StrEnum):
    PF = "pf"  # a physical function (the parent BF/IB/RDMA device)
    VF = "vf"  # an SR-IOV virtual function of a PF


class FabricDevice(PciFunction):
    """An IB/RDMA or high-speed Ethernet function (Mellanox/NVIDIA networking), PF or SR-IOV VF."""

    role: FabricRole
    parent: str | None = None  # a VF's PF (sysfs `physfn`)
    vfs: list[str] = Field(default_factory=list)  # a PF's VFs (sysfs `virtfn*`), in virtfn order
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    netdevs: list[str] = Field(default_factory=list)  # e.g. ["ibp59s0"]
    rdma_devices: list[str] = Field(default_factory=list)  # e.g. ["mlx5_0"]


class NvmeNamespace(Model):
    """A block device of an NVMe controller, keyed by a stable identity rather than by its by-id name (those changed
    between systemd versions)."""

    name: str  # "nvme0n1"
    wwid: str | None = None  # /sys/block/<name>/wwid: the stable identity
    serial: str | None = None  # the controller's serial
    by_id: list[str] = Field(default_factory=list)  # /dev/disk/by-id/... links to it, for humans
    size_bytes: int | None = None
    controller_pci: str | None = None
    numa_node: int | None = None
    in_use: list[str] = Field(default_factory=list)  # why it is not free: "mounted at /", "held by dm-0", ...

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
    cpus: list[int] = Field(default_factory=list)
    memory_mib: int = 0


class HostProblem(Model):
    """A sysfs entry that could not be read or made sense of. Reported, never fatal."""

    path: str
    message: str
    device: str | None = None  # the PCI address or block device it concerns, when known


class HostInventory(Model):
    """Everything discovery found on one host. `topology_hash` identifies it: an agent reports the whole inventory
    only when the hash moves."""

    hostname: str | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    fabric: list[FabricDevice] = Field(default_factory=list)
    nvme: list[NvmeNamespace] = Field(default_factory=list)
    numa: list[NumaCell] = Field(default_factory=list)
    iommu_groups: dict[int, list[str]] = Field(default_factory=dict)  # group -> every PCI function in it
    pci_functions: dict[str, PciFunction] = Field(default_factory=dict)  # every function named by an IOMMU group
    problems: list[HostProblem] = Field(default_factory=list)

    def topology_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json(exclude={"hostname"}).encode()).hexdigest()[:16]

    def gpu(self, address: str) -> Gpu | None:
        return next((gpu for gpu in self.gpus if gpu.address == address), None)

    def fabric_device(self, address: str) -> FabricDevice | None:
        return next((device for device in self.fabric if device.address == address), None)

    def problems_for(self, device: str) -> list[HostProblem]:
        return [problem for problem in self.problems if problem.device == device]
