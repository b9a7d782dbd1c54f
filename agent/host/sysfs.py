"""Discover a host's topology from sysfs: GPUs, fabric PFs and VFs, NVMe namespaces, NUMA cells and IOMMU groups.

PCI-level discovery is the primary source, because a GPU bound to `vfio-pci`, as every passthrough GPU is, is
invisible to NVML; `GpuDetails` only adds product and memory for GPUs the host driver holds. Everything is read under
`root` (`/` on a host, a fixture tree in tests) and nothing outside it (`rootfs.HostRoot`).

What it reads, relative to `root`:

    sys/bus/pci/devices/<addr>/        vendor, device, class, numa_node, driver@, iommu_group@, physfn@, virtfn<N>@,
                                       sriov_totalvfs, sriov_numvfs, net/, infiniband/       (@: a symlink)
    sys/kernel/iommu_groups/<g>/devices/<addr>
    sys/block/nvme<X>n<Y>/             wwid, size, holders/, <ns>p<N>/holders/, device@ -> the controller:
                                       device/serial, and its PCI function as device/device@ (or device/address,
                                       or, for a multipath subsystem, device/nvme<N>/device@)
    dev/disk/by-id/*@                  links whose target names a namespace, shown to humans
    proc/self/mounts, proc/swaps       what is in use (the agent must run in the host's mount namespace)
    sys/devices/system/node/node<N>/   cpulist, meminfo (or, with no NUMA, sys/devices/system/cpu/online and
                                       proc/meminfo as one cell 0)
    proc/sys/kernel/hostname
    proc/cpuinfo                       the `hypervisor` flag: the host is itself a virtual machine

A host that is a virtual machine (a Berth VM's guest, a cloud instance) lacks sources a bare-metal host has: no IOMMU
groups (no virtual IOMMU), no AER counters (its PCIe port services are off), no NUMA node for its GPUs (`numa_node`
-1). Discovery still reports its GPUs, and says which of those sources are missing, one host-wide problem line each
(no device named, so no slot is invalid for it alone: validation judges the groups and NUMA nodes themselves).

An entry that cannot be read or parsed never raises: it becomes a `HostProblem` and the fact is None, so validation
can turn it into a slot reason. Everything is sorted, so the same host gives the same `topology_hash`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.host.gpu_details import GpuDetail, GpuDetails, GpuDetailsError
from agent.host.rootfs import HostRoot
from contracts.pci import normalise_pci
from scheduler.host.inventory import (
    MAX_MESSAGE,
    MAX_NAME,
    MAX_PATH,
    MAX_PROBLEMS,
    FabricDevice,
    FabricRole,
    Gpu,
    GpuDetailSource,
    HostInventory,
    HostProblem,
    NumaCell,
    NvmeNamespace,
    PciFunction,
    pci_device,
)

NVIDIA = "10de"
MELLANOX = "15b3"  # Mellanox, now NVIDIA networking: ConnectX and BlueField
VFIO = "vfio-pci"
SECTOR = 512  # /sys/block/*/size counts 512-byte sectors whatever the device's block size

# NVIDIA PCI device id -> (product as nvidia-smi names it, memory MiB as nvidia-smi reports it). All a vfio-bound GPU
# offers; NVML or a recorded nvidia-smi replaces it for GPUs the host driver holds.
NVIDIA_GPUS: dict[str, GpuDetail] = {
    "2335": ("NVIDIA H200", 143771),  # H200 SXM 141GB
    "2330": ("NVIDIA H100 80GB HBM3", 81559),  # H100 SXM5 80GB
    "2331": ("NVIDIA H100 PCIe", 81559),
    "2321": ("NVIDIA H100 NVL", 95830),
    "2324": ("NVIDIA H800", 81559),
    "20b0": ("NVIDIA A100-SXM4-40GB", 40960),
    "20b2": ("NVIDIA A100-SXM4-80GB", 81920),
    "20b5": ("NVIDIA A100 80GB PCIe", 81920),
    "26b9": ("NVIDIA L40S", 46068),
    "27b8": ("NVIDIA L4", 23034),
    "2342": ("NVIDIA GH200", None),  # one id for the 96 GB and 144 GB parts: only NVML can tell
    "2901": ("NVIDIA B200", 183359),
}

_NAMESPACE = re.compile(r"^nvme\d+n\d+$")  # not partitions (nvme0n1p1), not hidden multipath paths (nvme0c0n1)
_NODE = re.compile(r"^node(\d+)$")
_VIRTFN = re.compile(r"^virtfn(\d+)$")
_CONTROLLER = re.compile(r"^nvme\d+$")
_HEX = re.compile(r"^0x([0-9a-fA-F]+)$")


def discover_host(root: Path = Path("/"), *, gpu_details: GpuDetails | None = None) -> HostInventory:
    """Everything the agent can learn about the host under `root`, problems included; never raises for what it
    finds. `gpu_details` adds product and memory for GPUs not bound to vfio-pci (NVML describes the machine it runs
    on, so pass it only when `root` is that machine's `/`)."""
    scan = _Scan(HostRoot(root))
    functions = scan.pci_functions()
    groups = scan.iommu_groups()
    for address, path in scan.group_members(groups).items():
        if address not in functions:  # a group member the bus listing did not show: read it through the group
            functions[address] = scan.pci_function(address, path)
    details, source = scan.gpu_details(gpu_details)
    ordered = [functions[address] for address in sorted(functions)]
    gpus = [scan.gpu(function, functions, details, source) for function in ordered if function.is_gpu]
    fabric = [scan.fabric(function) for function in ordered if function.is_fabric]
    grouped = sorted({address for members in groups.values() for address in members})
    in_groups = {address: model for address in grouped if (model := functions[address].model()) is not None}
    nvme, numa, hostname = scan.nvme(functions), scan.numa(), scan.hostname()
    if gpus and scan.virtual_machine():
        scan.missing_in_a_vm([function for function in ordered if function.is_gpu], groups)
    return HostInventory(
        hostname=hostname,
        gpus=gpus,
        fabric=fabric,
        nvme=nvme,
        numa=numa,
        iommu_groups=groups,
        pci_functions=in_groups,
        problems=scan.problems(),  # last: every read above may have added one
    )


@dataclass
class _Function:
    """One PCI function as read, with None for what could not be read."""

    address: str
    path: str  # its directory relative to the root, as it was reached (sys/bus/pci/devices/<addr>)
    vendor_id: str | None = None
    device_id: str | None = None
    class_code: str | None = None
    driver: str | None = None
    numa_node: int | None = None
    iommu_group: int | None = None

    @property
    def known(self) -> bool:
        return self.vendor_id is not None and self.device_id is not None and self.class_code is not None

    @property
    def is_gpu(self) -> bool:  # VGA (0300) or 3D controller (0302); NVSwitches (0680) and audio (0403) are not
        return self._is(NVIDIA, ("0300", "0302"))

    @property
    def is_fabric(self) -> bool:  # InfiniBand (0207) or Ethernet (0200)
        return self._is(MELLANOX, ("0207", "0200"))

    def _is(self, vendor: str, classes: tuple[str, ...]) -> bool:
        return self.known and self.vendor_id == vendor and (self.class_code or "")[:4] in classes

    def fields(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "class_code": self.class_code,
            "driver": self.driver,
            "numa_node": self.numa_node,
            "iommu_group": self.iommu_group,
        }

    def model(self) -> PciFunction | None:
        """None when its identity could not be read: the model needs vendor, device and class, and a problem
        naming its address says why it is missing."""
        return PciFunction(**self.fields()) if self.known else None


class _Scan:
    """The reads of one discovery, and the problems they met."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host
        self._problems: set[tuple[str, str, str | None]] = set()
        self.no_numa: set[str] = set()  # functions whose numa_node read -1

    # --- reading, with failures turned into problems -------------------------------------------------------------

    def problem(self, path: str, message: str, device: str | None) -> None:
        # Clipped to what a report may carry (a name read from a broken sysfs can be anything up to NAME_MAX).
        self._problems.add((("/" + path)[:MAX_PATH], message[:MAX_MESSAGE], device[:MAX_NAME] if device else device))

    def problems(self) -> list[HostProblem]:
        """Sorted; at most MAX_PROBLEMS, the last saying how many more there were (a report may carry no more)."""
        ordered = sorted(self._problems, key=lambda problem: (problem[0], problem[1], problem[2] or ""))
        found = [HostProblem(path=path, message=message, device=device) for path, message, device in ordered]
        if len(found) <= MAX_PROBLEMS:
            return found
        more = len(found) - (MAX_PROBLEMS - 1)
        return [*found[: MAX_PROBLEMS - 1], HostProblem(path="/sys", message=f"{more} more problems not listed")]

    def text(self, path: str, device: str | None, *, optional: bool = False) -> str | None:
        """The stripped contents of a file; None and a problem when unreadable (no problem when optional and
        absent)."""
        try:
            return self.host.read_text(path).strip()
        except FileNotFoundError:
            if not optional:
                self.problem(path, "missing", device)
        except IsADirectoryError:
            self.problem(path, "is a directory, expected a file", device)
        except OSError as error:
            self.problem(path, f"unreadable: {error.strerror or error}", device)
        except ValueError:
            self.problem(path, "not text", device)
        return None

    def number(self, path: str, device: str | None, *, optional: bool = True) -> int | None:
        value = self.text(path, device, optional=optional)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            self.problem(path, f"expected a number, read {value[:40]!r}", device)
            return None

    def hex_id(self, path: str, device: str, width: int) -> str | None:
        """`0x10de` -> `10de` (zero-padded to `width`)."""
        value = self.text(path, device)
        if value is None:
            return None
        match = _HEX.match(value)
        if not match or len(match.group(1)) > width:
            self.problem(path, f"expected a hex id like 0x{'0' * width}, read {value[:40]!r}", device)
            return None
        return match.group(1).lower().zfill(width)

    def link_name(self, path: str, device: str | None) -> str | None:
        """The name of what a symlink leads to (a driver, a group number, an address); None when there is no link.
        The resolved name, not the target's last component, so `../../..`-style targets work too. A link that is
        not one, or leads nowhere, is a problem."""
        target = None
        try:
            target = self.host.readlink(path)
            if target is None:
                return None
            return os.path.basename(self.host.real(path))
        except FileNotFoundError:
            self.problem(path, f"dangling symlink to {target}", device)
        except OSError as error:
            self.problem(path, f"unreadable symlink: {error.strerror or error}", device)
        return None

    def directory(self, path: str, device: str, what: str) -> bool:
        """Whether `path` leads to a directory; a problem saying why not when it does not."""
        try:
            if os.path.isdir(os.path.join(self.host.root, self.host.real(path))):
                return True
            self.problem(path, f"not a directory, expected {what}", device)
        except FileNotFoundError:
            self.problem(path, f"missing or a dangling symlink, expected {what}", device)
        except OSError as error:
            self.problem(path, f"unreadable: {error.strerror or error}", device)
        return False

    def exists(self, path: str) -> bool:
        """Whether there is an entry at all (a dangling link counts)."""
        try:
            return self.host.readlink(path) is not None or self.host.is_dir(path)
        except OSError:
            return True  # an entry that is not a link

    def listing(self, path: str, device: str | None) -> list[str]:
        """Entry names of a directory; [] when absent, [] and a problem when unreadable."""
        try:
            return self.host.listdir(path)
        except FileNotFoundError:
            return []
        except OSError as error:
            self.problem(path, f"unreadable directory: {error.strerror or error}", device)
            return []

    def address(self, value: str | None, path: str, device: str | None) -> str | None:
        if value is None:
            return None
        try:
            return normalise_pci(value)
        except ValueError:
            self.problem(path, f"expected a PCI address, read {value[:40]!r}", device)
            return None

    # --- PCI -----------------------------------------------------------------------------------------------------

    def pci_functions(self) -> dict[str, _Function]:
        functions: dict[str, _Function] = {}
        for name in self.listing("sys/bus/pci/devices", None):
            path = f"sys/bus/pci/devices/{name}"
            address = self.address(name, path, name)
            if address is not None:
                functions[address] = self.pci_function(address, path)
        return functions

    def pci_function(self, address: str, path: str) -> _Function:
        function = _Function(address=address, path=path)
        if not self.directory(path, address, "the function's directory"):
            return function
        function.vendor_id = self.hex_id(f"{path}/vendor", address, 4)
        function.device_id = self.hex_id(f"{path}/device", address, 4)
        function.class_code = self.hex_id(f"{path}/class", address, 6)
        function.driver = self.link_name(f"{path}/driver", address)
        node = self.number(f"{path}/numa_node", address)  # absent on a kernel without NUMA: no problem
        if node is not None and node < 0:
            self.no_numa.add(address)
        function.numa_node = node if node is not None and node >= 0 else None  # -1: the firmware gave none
        group = self.link_name(f"{path}/iommu_group", address)  # absent with the IOMMU off: a fact, not a problem
        if group is not None:
            if group.isdigit():
                function.iommu_group = int(group)
            else:
                self.problem(f"{path}/iommu_group", f"expected a group number, found {group[:40]!r}", address)
        return function

    def iommu_groups(self) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for name in self.listing("sys/kernel/iommu_groups", None):
            if not name.isdigit():
                self.problem(f"sys/kernel/iommu_groups/{name}", "expected a group number", None)
                continue
            path = f"sys/kernel/iommu_groups/{name}/devices"
            members = [self.address(entry, f"{path}/{entry}", entry) for entry in self.listing(path, None)]
            groups[int(name)] = sorted(member for member in members if member is not None)
        return dict(sorted(groups.items()))

    def group_members(self, groups: dict[int, list[str]]) -> dict[str, str]:
        return {
            address: f"sys/kernel/iommu_groups/{group}/devices/{address}"
            for group, members in groups.items()
            for address in members
        }

    # --- GPUs ----------------------------------------------------------------------------------------------------

    def gpu_details(self, source: GpuDetails | None) -> tuple[dict[str, GpuDetail], GpuDetailSource]:
        if source is None:
            return {}, GpuDetailSource.PCI_IDS
        try:
            return source.details(), source.source
        except GpuDetailsError as error:
            self.problem(error.path.lstrip("/"), str(error), None)
            return {}, GpuDetailSource.PCI_IDS

    def gpu(
        self,
        function: _Function,
        functions: dict[str, _Function],
        details: dict[str, GpuDetail],
        source: GpuDetailSource,
    ) -> Gpu:
        product, memory = NVIDIA_GPUS.get(function.device_id or "", (f"NVIDIA {NVIDIA}:{function.device_id}", None))
        detail_source = GpuDetailSource.PCI_IDS
        if function.driver != VFIO and function.address in details:  # a vfio-bound GPU is invisible to NVML
            product, detail_memory = details[function.address]
            memory = detail_memory if detail_memory is not None else memory
            detail_source = source
        device = pci_device(function.address)
        siblings = [a for a in sorted(functions) if a != function.address and pci_device(a) == device]
        return Gpu(
            **function.fields(),
            product=product,
            memory_mib=memory,
            detail_source=detail_source,
            functions=siblings,
        )

    # --- fabric --------------------------------------------------------------------------------------------------

    def fabric(self, function: _Function) -> FabricDevice:
        path, address = function.path, function.address
        is_vf = self.exists(f"{path}/physfn")  # a VF even when its physfn link leads nowhere
        parent = self.address(self.link_name(f"{path}/physfn", address), f"{path}/physfn", address)
        virtfns = sorted(
            ((int(match.group(1)), name) for name in self.listing(path, address) if (match := _VIRTFN.match(name))),
        )
        vfs = [
            self.address(self.link_name(f"{path}/{name}", address), f"{path}/{name}", address) for _, name in virtfns
        ]
        return FabricDevice(
            **function.fields(),
            role=FabricRole.VF if is_vf else FabricRole.PF,
            parent=parent,
            vfs=[vf for vf in vfs if vf is not None],
            sriov_totalvfs=self.number(f"{path}/sriov_totalvfs", address),
            sriov_numvfs=self.number(f"{path}/sriov_numvfs", address),
            netdevs=self.listing(f"{path}/net", address),
            rdma_devices=self.listing(f"{path}/infiniband", address),
        )

    # --- NVMe ----------------------------------------------------------------------------------------------------

    def nvme(self, functions: dict[str, _Function]) -> list[NvmeNamespace]:
        names = sorted((n for n in self.listing("sys/block", None) if _NAMESPACE.match(n)), key=_natural)
        if not names:
            return []
        by_id = self.by_id_links()
        mounts, swaps = self.mounts(), self.swaps()
        return [self.namespace(name, functions, by_id, mounts, swaps) for name in names]

    def namespace(
        self,
        name: str,
        functions: dict[str, _Function],
        by_id: dict[str, list[str]],
        mounts: dict[str, list[str]],
        swaps: set[str],
    ) -> NvmeNamespace:
        path = f"sys/block/{name}"
        if not self.directory(path, name, "the namespace's directory"):
            return NvmeNamespace(name=name, by_id=by_id.get(name, []))
        sectors = self.number(f"{path}/size", name, optional=False)
        serial = controller = None
        if self.directory(f"{path}/device", name, "the controller's directory"):
            serial = self.text(f"{path}/device/serial", name)
            controller = self.controller_pci(path, name)
        function = functions.get(controller) if controller else None
        return NvmeNamespace(
            name=name,
            wwid=self.text(f"{path}/wwid", name),
            serial=serial,
            by_id=by_id.get(name, []),
            size_bytes=sectors * SECTOR if sectors is not None else None,
            controller_pci=controller,
            numa_node=function.numa_node if function else None,
            in_use=self.in_use(name, path, mounts, swaps),
        )

    def controller_pci(self, path: str, name: str) -> str | None:
        """The PCI function behind a namespace's controller: `device/device@` as the kernel lays it out, else the
        controller's `address` file, else (native multipath: `device` is the subsystem) its first controller's."""
        for controller in self._controllers(path, name):
            target = self.link_name(f"{controller}/device", name)
            if target is None:
                target = self.text(f"{controller}/address", name, optional=True)
            if target is not None:
                return self.address(target, f"{controller}/device", name)
        self.problem(f"{path}/device", "no PCI function found for the controller", name)
        return None

    def _controllers(self, path: str, name: str) -> Iterator[str]:
        yield f"{path}/device"
        for entry in self.listing(f"{path}/device", name):
            if _CONTROLLER.match(entry):
                yield f"{path}/device/{entry}"

    def in_use(self, name: str, path: str, mounts: dict[str, list[str]], swaps: set[str]) -> list[str]:
        """Why the namespace is not free: it or a partition is mounted, used as swap, or held (LVM, dm, md)."""
        reasons: set[str] = set()
        partitions = [p for p in self.listing(path, name) if re.fullmatch(rf"{re.escape(name)}p\d+", p)]
        for device, device_path in [(name, path)] + [(p, f"{path}/{p}") for p in partitions]:
            reasons.update(f"mounted at {mountpoint}" for mountpoint in mounts.get(device, []))
            if device in swaps:
                reasons.add(f"used as swap ({device})")
            reasons.update(f"held by {holder}" for holder in self.listing(f"{device_path}/holders", name))
        return sorted(reasons)

    def by_id_links(self) -> dict[str, list[str]]:
        links: dict[str, list[str]] = {}
        for link in self.listing("dev/disk/by-id", None):
            try:
                target = self.host.readlink(f"dev/disk/by-id/{link}")
            except OSError:
                continue  # not a link: not ours to name
            if target is not None:
                links.setdefault(os.path.basename(target.rstrip("/")), []).append(f"/dev/disk/by-id/{link}")
        return links

    def mounts(self) -> dict[str, list[str]]:
        """Block device name -> mountpoints, for sources under /dev (`/dev/nvme0n1p1`, `/dev/dm-0`)."""
        mounted: dict[str, list[str]] = {}
        for line in (self.text("proc/self/mounts", None, optional=True) or "").splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0].startswith("/dev/"):
                mounted.setdefault(os.path.basename(fields[0]), []).append(_unescape(fields[1]))
        return mounted

    def swaps(self) -> set[str]:
        lines = (self.text("proc/swaps", None, optional=True) or "").splitlines()[1:]
        return {os.path.basename(line.split()[0]) for line in lines if line.startswith("/dev/")}

    # --- NUMA and the rest ---------------------------------------------------------------------------------------

    def numa(self) -> list[NumaCell]:
        base = "sys/devices/system/node"
        nodes = sorted(int(m.group(1)) for name in self.listing(base, None) if (m := _NODE.match(name)))
        if not nodes:  # no NUMA: the whole machine is cell 0
            cpus = self.text("sys/devices/system/cpu/online", None)
            meminfo = self.text("proc/meminfo", None)
            memory = _mem_total(meminfo, r"MemTotal:\s+(\d+)\s*kB")
            if meminfo is not None and memory is None:
                self.problem("proc/meminfo", "no MemTotal line", None)
            return [NumaCell(id=0, cpus=self.cpulist(cpus, "sys/devices/system/cpu/online"), memory_mib=memory or 0)]
        cells = []
        for node in nodes:
            path = f"{base}/node{node}"
            cpus = self.cpulist(self.text(f"{path}/cpulist", None), f"{path}/cpulist")
            meminfo = self.text(f"{path}/meminfo", None)
            memory = _mem_total(meminfo, rf"Node\s+{node}\s+MemTotal:\s+(\d+)\s*kB")
            if meminfo is not None and memory is None:
                self.problem(f"{path}/meminfo", f"no 'Node {node} MemTotal' line", None)
            cells.append(NumaCell(id=node, cpus=cpus, memory_mib=memory or 0))
        return cells

    def cpulist(self, value: str | None, path: str) -> list[int]:
        """`0-23,96-119` -> [0, ..., 23, 96, ..., 119]; empty for a memory-only node."""
        if not value:
            return []
        cpus: set[int] = set()
        for part in value.split(","):
            match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
            if not match:
                self.problem(path, f"expected a CPU list like 0-23,96-119, read {value[:40]!r}", None)
                return []
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            cpus.update(range(first, last + 1))
        return sorted(cpus)

    def virtual_machine(self) -> bool:
        """Whether the kernel runs under a hypervisor (x86's CPUID hypervisor bit, shown as a cpuinfo flag)."""
        cpuinfo = self.text("proc/cpuinfo", None, optional=True) or ""
        return any(
            line.startswith("flags") and " hypervisor" in f" {line.partition(':')[2]} " for line in cpuinfo.splitlines()
        )

    def missing_in_a_vm(self, gpus: list[_Function], groups: dict[int, list[str]]) -> None:
        """One line per source a virtual machine lacks, for its GPUs."""
        vm = "a virtual machine (cpuinfo: hypervisor)"
        if not groups:
            self.problem(
                "sys/kernel/iommu_groups",
                f"{vm} with no IOMMU groups (no virtual IOMMU): its GPUs cannot be passed through to VMs from here",
                None,
            )
        no_aer = [g.address for g in gpus if not self.exists(f"{g.path}/aer_dev_fatal")]
        if no_aer:
            self.problem(
                "sys/bus/pci/devices/*/aer_dev_fatal",
                f"{vm} with no PCIe AER counters (its PCIe port "
                f"services are off): no PCIe errors can be read for {', '.join(no_aer)}",
                None,
            )
        no_numa = sorted(g.address for g in gpus if g.address in self.no_numa)
        if no_numa:
            self.problem(
                "sys/bus/pci/devices/*/numa_node",
                f"{vm} that gives no NUMA node (numa_node -1) for {', '.join(no_numa)}",
                None,
            )

    def hostname(self) -> str | None:
        return self.text("proc/sys/kernel/hostname", None, optional=True) or None


def _mem_total(text: str | None, pattern: str) -> int | None:
    """The kB figure of a MemTotal line, in MiB."""
    match = re.search(pattern, text or "", re.MULTILINE)
    return int(match.group(1)) // 1024 if match else None


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash in octal (`\\040`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _natural(name: str) -> tuple[int | str, ...]:
    """nvme2n1 before nvme10n1."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
