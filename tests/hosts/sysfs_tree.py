"""Fixture host trees shaped like real sysfs, for discovery tests, the benchmark and dry runs against a "host".

A `HostSpec` says what the host has; `write_host` lays it out under a root the way the kernel does, symlinks
included, so discovery reads a fixture exactly as it reads `/`:

    sys/devices/pci0000:<bus>/<addr>/              a PCI function: vendor, device, class, numa_node (-1: none, as a
                                                   virtual machine's guest reads it: tests/hosts/recorded/),
                                                   driver@, iommu_group@; a PF's VFs sit beside it, linked by
                                                   virtfn<N>@ and physfn@; sriov_*, net/<netdev>/, infiniband/<dev>/
    sys/bus/pci/devices/<addr>@                    -> the function's directory
    sys/bus/pci/drivers/<driver>/<addr>@           a directory per driver, a link per bound function
    sys/kernel/iommu_groups/<g>/devices/<addr>@
    NVMe controller nvme<N> at PCI function <addr> (one namespace, nvme<N>n1):
      sys/devices/pci0000:<bus>/<addr>/nvme/nvme<N>/            serial, model, address, device@ -> ../../../<addr>
      .../nvme/nvme<N>/nvme<N>n1/                               wwid, size (sectors), device@ -> ../../nvme<N>,
                                                                holders/<h>@, nvme<N>n1p<K>/ (partition, size, holders/)
      sys/block/nvme<N>n1@                                      -> that namespace directory
      dev/disk/by-id/nvme-<model>_<serial>@, nvme-<wwid>@       -> ../../nvme<N>n1 (and -part<K> -> ../../nvme<N>n1p<K>)
    sys/devices/system/node/node<N>/cpulist, meminfo; sys/devices/system/cpu/online; proc/meminfo
    proc/self/mounts, proc/sys/kernel/hostname, and recorded/nvidia-smi-q-x.xml when GPUs are recorded

`Fault`s are applied last, through the symlinks, to break a tree the way a real host breaks.

These trees are constructed to the kernel's documented layout; a recorded one, a real H200 as a VM's guest sees it,
is in tests/hosts/recorded/ (`tests/hosts/recorded.py` makes it a root).

The ready-made hosts (`hgx_h200()` and its variants) return a `FixtureHost`: the spec and the fleet-file node that an
operator would have approved for it, camelCase as in `fleet/node.py`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

RECORDED_NVIDIA_SMI = "recorded/nvidia-smi-q-x.xml"
GIB_KB = 1024 * 1024


@dataclass(frozen=True)
class Function:
    """A PCI function with no role of its own in discovery: a GPU's audio function, a bridge, a stranger."""

    address: str
    vendor: str
    device: str
    class_code: str
    driver: str | None = None
    numa_node: int | None = None
    iommu_group: int | None = None


@dataclass(frozen=True)
class GpuSpec:
    address: str
    numa_node: int | None
    iommu_group: int | None
    device_id: str = "2335"  # H200 SXM 141GB
    driver: str | None = "vfio-pci"
    class_code: str = "030200"  # 3D controller, as SXM parts are
    functions: tuple[Function, ...] = ()  # other functions of the same device (a PCIe card's audio)


@dataclass(frozen=True)
class VfSpec:
    address: str
    iommu_group: int | None
    driver: str | None = "vfio-pci"
    device_id: str = "101e"  # ConnectX family mlx5Gen virtual function


@dataclass(frozen=True)
class FabricSpec:
    """A Mellanox/NVIDIA networking PF (ConnectX-7 InfiniBand by default) and its VFs."""

    address: str
    numa_node: int | None
    iommu_group: int | None
    netdevs: tuple[str, ...] = ()
    rdma_devices: tuple[str, ...] = ()
    vfs: tuple[VfSpec, ...] = ()
    sriov_totalvfs: int = 16
    device_id: str = "1021"
    class_code: str = "020700"
    driver: str | None = "mlx5_core"


@dataclass(frozen=True)
class PartitionSpec:
    number: int
    mountpoint: str | None = None
    holders: tuple[str, ...] = ()  # dm-0, md127: created as sys/devices/virtual/block/<name>


@dataclass(frozen=True)
class NvmeSpec:
    controller: int  # N in nvme<N>; the namespace is nvme<N>n1
    pci: str
    numa_node: int | None
    iommu_group: int | None
    serial: str
    wwid: str
    model: str = "SAMSUNG MZWLO3T8HCLS-00A07"
    size_bytes: int = 3_840_755_982_336
    partitions: tuple[PartitionSpec, ...] = ()
    holders: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"nvme{self.controller}n1"

    @property
    def by_id(self) -> str:
        """The link an operator puts in the fleet file (udev's model_serial name)."""
        return f"nvme-{self.model.replace(' ', '_')}_{self.serial}"


@dataclass(frozen=True)
class NumaSpec:
    id: int
    cpus: str  # as cpulist writes it: "0-55,112-167"
    memory_mib: int


@dataclass(frozen=True)
class RecordedGpu:
    """One GPU as a recorded `nvidia-smi -q -x` lists it (only GPUs the host driver holds appear there)."""

    address: str  # written with nvidia-smi's 8-digit domain, upper case
    product: str
    memory_mib: int


@dataclass(frozen=True)
class Fault:
    """A way a real host's sysfs goes wrong, at a path relative to the root (followed through symlinks)."""

    path: str
    kind: str  # "text", "directory", "remove", "dangling"
    content: str = ""

    @classmethod
    def text(cls, path: str, content: str) -> Fault:
        return cls(path, "text", content)

    @classmethod
    def directory(cls, path: str) -> Fault:
        """The entry becomes a directory: reading it as a file fails."""
        return cls(path, "directory")

    @classmethod
    def remove(cls, path: str) -> Fault:
        return cls(path, "remove")

    @classmethod
    def dangling(cls, path: str, target: str = "../nowhere") -> Fault:
        return cls(path, "dangling", target)


@dataclass(frozen=True)
class HostSpec:
    hostname: str
    numa: tuple[NumaSpec, ...]
    gpus: tuple[GpuSpec, ...] = ()
    fabric: tuple[FabricSpec, ...] = ()
    nvme: tuple[NvmeSpec, ...] = ()
    functions: tuple[Function, ...] = ()  # anything else on the bus
    mounts: tuple[tuple[str, str], ...] = (("/dev/mapper/vg0-root", "/"),)  # (source, mountpoint) besides partitions
    recorded_gpus: tuple[RecordedGpu, ...] = ()
    iommu: bool = True  # False: the IOMMU is off, no function has a group
    numa_sysfs: bool = True  # False: a kernel without NUMA, no node directories, every numa_node -1
    faults: tuple[Fault, ...] = ()


# The lines of each AER statistics file, as drivers/pci/pcie/aer.c prints them (Linux 6.x; the ABI is
# Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats): one "<error> <count>" per error, then the total.
AER_LINES = {
    "aer_dev_correctable": (
        ["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"],
        "TOTAL_ERR_COR",
    ),
    "aer_dev_fatal": (
        [
            "Undefined",
            "DLP",
            "SDES",
            "TLP",
            "FCP",
            "CmpltTO",
            "CmpltAbrt",
            "UnxCmplt",
            "RxOF",
            "MalfTLP",
            "ECRC",
            "UnsupReq",
            "ACSViol",
            "UncorrIntErr",
            "BlockedTLP",
            "AtomicOpBlocked",
            "TLPBlockedErr",
            "PoisonTLPBlocked",
        ],
        "TOTAL_ERR_FATAL",
    ),
    "aer_dev_nonfatal": (
        [
            "Undefined",
            "DLP",
            "SDES",
            "TLP",
            "FCP",
            "CmpltTO",
            "CmpltAbrt",
            "UnxCmplt",
            "RxOF",
            "MalfTLP",
            "ECRC",
            "UnsupReq",
            "ACSViol",
            "UncorrIntErr",
            "BlockedTLP",
            "AtomicOpBlocked",
            "TLPBlockedErr",
            "PoisonTLPBlocked",
        ],
        "TOTAL_ERR_NONFATAL",
    ),
}


def write_pcie_health(
    root: Path,
    address: str,
    *,
    fatal: int = 0,
    nonfatal: int = 0,
    correctable: int = 0,
    speed: str = "32.0 GT/s PCIe",
    max_speed: str = "32.0 GT/s PCIe",
    width: int = 16,
    max_width: int = 16,
) -> None:
    """A function's AER statistics and link attributes, as sysfs shows them (the first error of each file carries
    the count, so the lines add up to the total as the kernel's do)."""
    device = root / "sys/bus/pci/devices" / address
    for name, total in (("aer_dev_fatal", fatal), ("aer_dev_nonfatal", nonfatal), ("aer_dev_correctable", correctable)):
        errors, total_name = AER_LINES[name]
        lines = [f"{error} {total if i == 0 else 0}" for i, error in enumerate(errors)] + [f"{total_name} {total}"]
        (device / name).write_text("\n".join(lines) + "\n")
    for name, value in (
        ("current_link_speed", speed),
        ("max_link_speed", max_speed),
        ("current_link_width", width),
        ("max_link_width", max_width),
    ):
        (device / name).write_text(f"{value}\n")


@dataclass(frozen=True)
class FixtureHost:
    spec: HostSpec
    node: dict[str, Any] = field(default_factory=dict)  # the fleet-file node approved for this host

    @property
    def name(self) -> str:
        return str(self.node["name"])

    def write(self, root: Path) -> Path:
        write_host(root, self.spec)
        return root

    def recorded_nvidia_smi(self, root: Path) -> Path | None:
        return root / RECORDED_NVIDIA_SMI if self.spec.recorded_gpus else None


# --- writing a tree ----------------------------------------------------------------------------------------------


def write_host(root: Path, spec: HostSpec) -> None:
    """Lay `spec` out under `root` (created if needed) as sysfs, procfs and /dev would show it."""
    tree = _Tree(root, iommu=spec.iommu, numa=spec.numa_sysfs)
    tree.numa(spec.numa)
    for gpu in spec.gpus:
        tree.function(gpu.address, "10de", gpu.device_id, gpu.class_code, gpu.driver, gpu.numa_node, gpu.iommu_group)
        for function in gpu.functions:
            tree.plain(function)
    for pf in spec.fabric:
        tree.fabric(pf)
    for nvme in spec.nvme:
        tree.nvme(nvme)
    for function in spec.functions:
        tree.plain(function)
    tree.mounts(spec)
    tree.file("proc/sys/kernel/hostname", spec.hostname + "\n")
    if spec.recorded_gpus:
        tree.file(RECORDED_NVIDIA_SMI, nvidia_smi_xml(spec.recorded_gpus))
    for fault in spec.faults:
        tree.fault(fault)


def nvidia_smi_xml(gpus: tuple[RecordedGpu, ...] | list[RecordedGpu]) -> str:
    """What `nvidia-smi -q -x` writes, cut to the elements discovery reads plus a few it must skip over: a constructed
    variant (driver 550, DTD v12) of the recorded one in tests/hosts/recorded/h200-guest-2026-11-27/nvidia-smi-q.xml
    (driver 580, DTD v13, tab-indented), which has the same three elements where this puts them."""
    entries = []
    for gpu in gpus:
        domain, rest = gpu.address.split(":", 1)
        bus_id = f"{int(domain, 16):08X}:{rest.upper()}"
        entries.append(_GPU_XML.format(bus_id=bus_id, bus=rest[:2].upper(), product=escape(gpu.product), gpu=gpu))
    return _LOG_XML.format(count=len(gpus), gpus="".join(entries))


_LOG_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
    <driver_version>550.127.08</driver_version>
    <attached_gpus>{count}</attached_gpus>
{gpus}</nvidia_smi_log>
"""
_GPU_XML = """    <gpu id="{bus_id}">
        <product_name>{product}</product_name>
        <product_brand>NVIDIA</product_brand>
        <pci>
            <pci_bus>{bus}</pci_bus>
            <pci_bus_id>{bus_id}</pci_bus_id>
        </pci>
        <fb_memory_usage>
            <total>{gpu.memory_mib} MiB</total>
            <reserved>0 MiB</reserved>
            <used>1 MiB</used>
        </fb_memory_usage>
    </gpu>
"""


class _Tree:
    def __init__(self, root: Path, *, iommu: bool, numa: bool) -> None:
        self.root = root
        self.iommu = iommu
        self.numa_sysfs = numa
        root.mkdir(parents=True, exist_ok=True)

    def file(self, path: str, content: str) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)

    def dir(self, path: str) -> None:
        (self.root / path).mkdir(parents=True, exist_ok=True)

    def link(self, path: str, target: str, *, exact: str | None = None) -> None:
        """A relative symlink at `path` to `target`, both relative to the root, as sysfs links are (spelt `exact`
        when given)."""
        location = self.root / path
        location.parent.mkdir(parents=True, exist_ok=True)
        location.symlink_to(exact or os.path.relpath(self.root / target, location.parent))

    @staticmethod
    def device_dir(address: str) -> str:
        domain, bus, _ = address.split(":")
        return f"sys/devices/pci{domain}:{bus}/{address}"

    def function(
        self,
        address: str,
        vendor: str,
        device: str,
        class_code: str,
        driver: str | None,
        numa_node: int | None,
        iommu_group: int | None,
    ) -> str:
        path = self.device_dir(address)
        self.file(f"{path}/vendor", f"0x{vendor}\n")
        self.file(f"{path}/device", f"0x{device}\n")
        self.file(f"{path}/class", f"0x{class_code}\n")
        self.file(f"{path}/numa_node", f"{-1 if numa_node is None or not self.numa_sysfs else numa_node}\n")
        self.link(f"sys/bus/pci/devices/{address}", path)
        if driver is not None:
            self.dir(f"sys/bus/pci/drivers/{driver}")
            self.link(f"{path}/driver", f"sys/bus/pci/drivers/{driver}")
            self.link(f"sys/bus/pci/drivers/{driver}/{address}", path)
        if iommu_group is not None and self.iommu:
            self.link(f"{path}/iommu_group", f"sys/kernel/iommu_groups/{iommu_group}")
            self.link(f"sys/kernel/iommu_groups/{iommu_group}/devices/{address}", path)
        return path

    def plain(self, f: Function) -> None:
        self.function(f.address, f.vendor, f.device, f.class_code, f.driver, f.numa_node, f.iommu_group)

    def fabric(self, pf: FabricSpec) -> None:
        path = self.function(pf.address, "15b3", pf.device_id, pf.class_code, pf.driver, pf.numa_node, pf.iommu_group)
        self.file(f"{path}/sriov_totalvfs", f"{pf.sriov_totalvfs}\n")
        self.file(f"{path}/sriov_numvfs", f"{len(pf.vfs)}\n")
        for name in pf.netdevs:
            self.dir(f"{path}/net/{name}")
        for name in pf.rdma_devices:
            self.dir(f"{path}/infiniband/{name}")
        for index, vf in enumerate(pf.vfs):
            vf_path = self.function(
                vf.address, "15b3", vf.device_id, pf.class_code, vf.driver, pf.numa_node, vf.iommu_group
            )
            self.link(f"{path}/virtfn{index}", vf_path)
            self.link(f"{vf_path}/physfn", path)

    def nvme(self, nvme: NvmeSpec) -> None:
        pci = self.function(nvme.pci, "144d", "a824", "010802", "nvme", nvme.numa_node, nvme.iommu_group)
        controller = f"{pci}/nvme/nvme{nvme.controller}"
        self.file(f"{controller}/serial", f"{nvme.serial}\n")
        self.file(f"{controller}/model", f"{nvme.model}\n")
        self.file(f"{controller}/address", f"{nvme.pci}\n")
        self.link(f"{controller}/device", pci, exact=f"../../../{nvme.pci}")  # the kernel's spelling
        namespace = f"{controller}/{nvme.name}"
        self.file(f"{namespace}/wwid", f"{nvme.wwid}\n")
        self.file(f"{namespace}/size", f"{nvme.size_bytes // 512}\n")
        self.link(f"{namespace}/device", controller)
        self.holders(namespace, nvme.holders)
        self.link(f"sys/block/{nvme.name}", namespace)
        for link in (nvme.by_id, f"nvme-{nvme.wwid}"):
            self.link(f"dev/disk/by-id/{link}", f"dev/{nvme.name}")
        self.file(f"dev/{nvme.name}", "")  # stands in for the block device node
        for partition in nvme.partitions:
            name = f"{nvme.name}p{partition.number}"
            self.file(f"{namespace}/{name}/partition", f"{partition.number}\n")
            self.file(f"{namespace}/{name}/size", f"{nvme.size_bytes // 512 // 4}\n")
            self.holders(f"{namespace}/{name}", partition.holders)
            self.file(f"dev/{name}", "")
            for link in (nvme.by_id, f"nvme-{nvme.wwid}"):
                self.link(f"dev/disk/by-id/{link}-part{partition.number}", f"dev/{name}")

    def holders(self, path: str, holders: tuple[str, ...]) -> None:
        self.dir(f"{path}/holders")
        for holder in holders:
            self.dir(f"sys/devices/virtual/block/{holder}")
            self.link(f"{path}/holders/{holder}", f"sys/devices/virtual/block/{holder}")

    def numa(self, cells: tuple[NumaSpec, ...]) -> None:
        for cell in cells if self.numa_sysfs else ():
            base = f"sys/devices/system/node/node{cell.id}"
            self.file(f"{base}/cpulist", f"{cell.cpus}\n")
            kb = cell.memory_mib * 1024
            self.file(
                f"{base}/meminfo",
                f"Node {cell.id} MemTotal:       {kb} kB\nNode {cell.id} MemFree:        {kb // 2} kB\n",
            )
        last_cpu = max(int(part.split("-")[-1]) for cell in cells for part in cell.cpus.split(","))
        self.file("sys/devices/system/cpu/online", f"0-{last_cpu}\n")
        total = sum(cell.memory_mib for cell in cells) * 1024
        self.file("proc/meminfo", f"MemTotal:       {total} kB\nMemFree:        {total // 2} kB\n")

    def mounts(self, spec: HostSpec) -> None:
        lines = ["sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0", "proc /proc proc rw,nosuid,nodev,noexec 0 0"]
        lines += [f"{source} {_escape_mount(point)} ext4 rw,relatime 0 0" for source, point in spec.mounts]
        for nvme in spec.nvme:
            for partition in nvme.partitions:
                if partition.mountpoint is not None:
                    source = f"/dev/{nvme.name}p{partition.number}"
                    lines.append(f"{source} {_escape_mount(partition.mountpoint)} ext4 rw,relatime 0 0")
        self.file("proc/self/mounts", "\n".join(lines) + "\n")

    def fault(self, fault: Fault) -> None:
        target = self.root / fault.path
        if fault.kind == "text":
            target.write_text(fault.content)
            return
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        if fault.kind == "directory":
            target.mkdir(parents=True)
        elif fault.kind == "dangling":
            target.symlink_to(fault.content)


def _escape_mount(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")


# --- ready-made hosts --------------------------------------------------------------------------------------------

# The j22u05 bundle profile (docs/seeds.md, "Slot approval from each host's own topology"): slot -> GPU and fabric
# PF. NVMe controllers are this fixture's own choice.
SLOT_GPUS = ("1b", "3c", "4b", "5c", "9a", "bb", "cd", "dc")
SLOT_FABRIC = ("1a", "3a", "4d", "5d", "9b", "ba", "ca", "db")
SLOT_NVME = ("21", "22", "23", "24", "a1", "a2", "a3", "a4")
BOOT_NVME = "0000:02:00.0"


def _pci(bus: str, function: int = 0) -> str:
    return f"0000:{bus}:00.{function}"


def _hgx_spec(hostname: str, host: int, *, vfs: bool = True) -> HostSpec:
    """An 8x H200 HGX host: slot i has GPU, PF (+ its VF at .1), NVMe; NUMA 0 for slots 0-3, 1 for 4-7. Every GPU,
    VF, PF and NVMe controller is alone in its IOMMU group (GPU 20+i, VF 40+i, NVMe 60+i, PF 80+i)."""
    gpus, fabric, nvme = [], [], []
    for i in range(8):
        numa = i // 4
        gpus.append(GpuSpec(_pci(SLOT_GPUS[i]), numa, 20 + i))
        bus = int(SLOT_FABRIC[i], 16)
        fabric.append(
            FabricSpec(
                _pci(SLOT_FABRIC[i]),
                numa,
                80 + i,
                netdevs=(f"ibp{bus}s0",),
                rdma_devices=(f"mlx5_{i}",),
                vfs=(VfSpec(_pci(SLOT_FABRIC[i], 1), 40 + i),) if vfs else (),
            )
        )
        nvme.append(NvmeSpec(i, _pci(SLOT_NVME[i]), numa, 60 + i, f"S6XXXXXX{i}", f"eui.002538{host:02x}{i:08x}"))
    boot = NvmeSpec(
        8,
        BOOT_NVME,
        0,
        5,
        f"S665NX0T{host:04d}",
        f"eui.00253888{host:04x}ffff",
        model="SAMSUNG MZ1L2960HCJR-00A07",
        size_bytes=960_197_124_096,
        partitions=(PartitionSpec(1, mountpoint="/boot/efi"), PartitionSpec(2, holders=("dm-0",))),
    )
    cells = (
        NumaSpec(0, "0-55,112-167", 1024 * 1024),
        NumaSpec(1, "56-111,168-223", 1024 * 1024),
    )
    return HostSpec(hostname=hostname, numa=cells, gpus=tuple(gpus), fabric=tuple(fabric), nvme=(*nvme, boot))


def _hgx_node(name: str, host: int, *, shared_parent: bool = False) -> dict[str, Any]:
    slots = []
    for i in range(8):
        slot: dict[str, Any] = {
            "index": i,
            "gpuPci": _pci(SLOT_GPUS[i]),
            "fabricParentPci": _pci(SLOT_FABRIC[i]),
            "fabricVfPci": _pci(SLOT_FABRIC[i], 1),
            "fabricClaimMode": "per_slot_vf",
            "nvmeDevice": f"/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6XXXXXX{i}",
            "numaNode": i // 4,
            "vcpus": 24,
            "memoryMiB": 131072,
            "mac": f"52:54:00:{host:02x}:00:{i:02x}",
            "privateIp": f"10.100.{host}.{10 + i}",
            "approved": True,
        }
        if shared_parent:  # j22u15's shape, here by pairs: slots name one parent, and no slot has a VF
            slot.update(fabricParentPci=_pci(SLOT_FABRIC[i - i % 2]), fabricClaimMode="shared_parent")
            del slot["fabricVfPci"]
        slots.append(slot)
    return {"name": name, "cpus": 224, "memoryMiB": 2097152, "numaNodes": 2, "slots": slots}


def hgx_h200() -> FixtureHost:
    """Eight complete per-slot-VF bundles: every slot validates."""
    return FixtureHost(_hgx_spec("hgx-h200", 32), _hgx_node("hgx-h200", 32))


def j22u15() -> FixtureHost:
    """j22u15 (docs/seeds.md, "A shared parent fabric device blocks slices"): fabric PFs without VFs (sriov_numvfs
    0), slots sharing a parent per pair."""
    return FixtureHost(_hgx_spec("j22u15", 15, vfs=False), _hgx_node("j22u15", 15, shared_parent=True))


def missing_gpu() -> FixtureHost:
    """Slot 5's GPU is physically absent, while the fleet file still approves eight slots."""
    spec = _hgx_spec("missing-gpu", 33)
    gpus = tuple(gpu for gpu in spec.gpus if gpu.address != _pci(SLOT_GPUS[5]))
    return FixtureHost(replace(spec, gpus=gpus), _hgx_node("missing-gpu", 33))


def vf_declared_twice() -> FixtureHost:
    """The host is sound; the fleet file gives slot 3 slot 2's VF (and parent)."""
    node = _hgx_node("vf-declared-twice", 34)
    node["slots"][3].update(fabricParentPci=_pci(SLOT_FABRIC[2]), fabricVfPci=_pci(SLOT_FABRIC[2], 1))
    return FixtureHost(_hgx_spec("vf-declared-twice", 34), node)


def nvme_mounted() -> FixtureHost:
    """Slot 1's NVMe has a partition mounted at /var/lib/docker."""
    spec = _hgx_spec("nvme-mounted", 35)
    nvme = tuple(
        replace(n, partitions=(PartitionSpec(1, mountpoint="/var/lib/docker"),)) if n.controller == 1 else n
        for n in spec.nvme
    )
    return FixtureHost(replace(spec, nvme=nvme), _hgx_node("nvme-mounted", 35))


def gpu_on_nvidia() -> FixtureHost:
    """Slot 0's GPU is bound to the host's `nvidia` driver; nvidia-smi was recorded, and lists that GPU alone."""
    spec = _hgx_spec("gpu-on-nvidia", 36)
    gpus = tuple(replace(g, driver="nvidia") if g.address == _pci(SLOT_GPUS[0]) else g for g in spec.gpus)
    recorded = (RecordedGpu(_pci(SLOT_GPUS[0]), "NVIDIA H200", 143771),)
    return FixtureHost(replace(spec, gpus=gpus, recorded_gpus=recorded), _hgx_node("gpu-on-nvidia", 36))


def malformed() -> FixtureHost:
    """Slot 6's GPU has garbage in `numa_node`; slot 7's `vendor` is a directory and cannot be read."""
    spec = _hgx_spec("malformed", 37)
    faults = (
        Fault.text(f"sys/bus/pci/devices/{_pci(SLOT_GPUS[6])}/numa_node", "garbage\n"),
        Fault.directory(f"sys/bus/pci/devices/{_pci(SLOT_GPUS[7])}/vendor"),
    )
    return FixtureHost(replace(spec, faults=faults), _hgx_node("malformed", 37))


FIXTURE_HOSTS = (hgx_h200, j22u15, missing_gpu, vf_declared_twice, nvme_mounted, gpu_on_nvidia, malformed)


def all_fixture_hosts() -> list[FixtureHost]:
    return [make() for make in FIXTURE_HOSTS]
