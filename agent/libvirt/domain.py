"""The libvirt domain XML for one allocation, as a pure function of its VM spec and the agent's configuration.

`create` on the libvirt runtime defines this document and starts it. Everything in it comes from the accepted
node-scheduler plan, since the runtime executor invents no placement (docs/seeds.md, "The runtime executor carries
out the plan"), and the same allocation always gives the same name, UUID and bytes, which is what lets `create`
run twice and change nothing the second time.

What the guest gets:

- vCPUs and memory: the sums over the bundles. When every bundle sits on one NUMA node, the vCPUs float over that
  node's host CPUs and memory is bound to it (`strict`); a plan spread over NUMA nodes is not pinned at all, because
  pinning it to one node would be wrong and pinning it to several buys nothing.
- the boot disk (a qcow2 overlay, `vda`), each bundle's raw NVMe as a virtio block disk (`vdb`, `vdc`, ... in
  bundle order) whose serial `berth-slot-<slot index>` lets the guest find a slot's disk by
  `/dev/disk/by-id/virtio-berth-slot-<n>` whatever order the kernel probes them in, and the NoCloud seed last, a
  read-only virtio disk with the serial `berth-seed`;
- each bundle's GPU and fabric VF passed through (`managed='yes'`: libvirt binds them to vfio-pci and back), at
  pinned guest PCI addresses (the layout below), one virtio NIC with the first bundle's MAC, the guest agent
  channel, a serial console, and no memory balloon (a balloon cannot reclaim memory that VFIO has pinned).

Guest PCI layout (q35). Bundle i (0-based, in plan order) owns two libvirt PCI buses, each a `pcie-root-port`
whose controller index is the bus number:

    bundle i  GPU        bus 2*i + 1, slot 0x00, function 0x0
              fabric VF  bus 2*i + 2, slot 0x00, function 0x0   (the bus is reserved even if the bundle has no VF)

The root ports themselves are pinned on the root complex (`pcie.0`, bus 0x00): bus b's port at slot 0x01 + (b-1)//8,
function (b-1)%8, eight ports to a multifunction slot, as libvirt itself packs them. The buses are contiguous from 1
on purpose: libvirt fills every gap in the PCI controller indexes with an auto-added root port, so a sparse layout
(GPUs from 0x10, say) would add a dozen empty root ports, each asking the firmware for an I/O window it does not
have. Pinning the root ports too is what keeps the guest's view stable across libvirt releases (KubeVirt moved
guest addresses between releases and Windows guests took their disks offline). Note that libvirt's `bus` is the
controller index; the bus number the guest's firmware enumerates can differ, but it is a function of this layout.
Devices libvirt addresses itself (the disks, the NIC, the virtio-serial controller) land on further root ports it
adds after these.
"""

from __future__ import annotations

import hashlib
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.allocation import VmSpec
from contracts.pci import normalise_pci
from contracts.placement import Bundle

# Never change this: every domain Berth has defined is named by a UUID in it, and a new namespace would make
# `create` define a second domain for an allocation that already has one.
DOMAIN_NAMESPACE = uuid.UUID("897023a2-de2f-4924-a025-15badc478f46")

GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
SEED_SERIAL = "berth-seed"  # the seed disk's serial: how a reader of the XML tells it from the boot disk
MAX_NAME_LENGTH = 64
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_ROOT_PORTS_PER_SLOT = 8
_FIRST_ROOT_PORT_SLOT = 0x01
_LAST_ROOT_PORT_SLOT = 0x1E  # 0x1f is the ICH9 LPC/SATA/SMBus slot on q35


# Configuration -------------------------------------------------------------------------------------------------


class DomainConfig(BaseModel):
    """What the operator configures on the agent: the same for every domain the agent defines."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    machine: str = "q35"
    # The accelerator: `kvm` (hardware virtualisation, every real GPU host) or `qemu` (TCG, software emulation: a
    # host where KVM does not run guests, such as a VM without nested virtualisation). The driver chooses it per host
    # (driver.py, `choose_accelerator`) and the host report says which; never a silent fallback.
    domain_type: Literal["kvm", "qemu"] = "kvm"
    # False on a host with no GPU to pass through (a test host, a laptop): the plan's GPUs and NVMe are bookkeeping
    # only, nothing of them is attached, and the `gpus` readiness gate is skipped and says so.
    passthrough: bool = True
    # UEFI (OVMF) by default: GPUs with large BARs (H100, H200) need the 64-bit MMIO space that OVMF maps and SeaBIOS
    # does not; libvirt picks the firmware build (`<os firmware='efi'>`). `bios` for images that cannot boot UEFI.
    firmware: Literal["efi", "bios"] = "efi"
    emulator: str | None = None  # None: libvirt's default QEMU binary for the machine
    network: str | None = None  # a libvirt network name ...
    bridge: str | None = None  # ... or a host bridge: exactly one of the two
    storage_pool_path: Path  # where the boot overlays and seed ISOs live
    host_cpus_by_numa: dict[int, list[int]] = Field(default_factory=dict)  # from discovery
    name_prefix: str = "berth-"

    @field_validator("machine")
    @classmethod
    def _pcie_machine(cls, value: str) -> str:
        """The guest PCI layout is built from pcie-root-ports, which only a q35 (PCIe) machine has."""
        if "q35" not in value:
            raise ValueError(f"machine {value!r} is not a q35 machine type; the passthrough layout needs PCIe")
        return value

    @field_validator("host_cpus_by_numa")
    @classmethod
    def _cpus(cls, value: dict[int, list[int]]) -> dict[int, list[int]]:
        for node, cpus in value.items():
            if node < 0 or any(cpu < 0 for cpu in cpus):
                raise ValueError(f"NUMA node {node}: node and CPU numbers must not be negative")
        return {node: sorted(set(cpus)) for node, cpus in value.items()}

    @model_validator(mode="after")
    def _one_attachment(self) -> DomainConfig:
        if (self.network is None) == (self.bridge is None):
            raise ValueError("set exactly one of `network` (a libvirt network) and `bridge` (a host bridge)")
        return self


# Identity ------------------------------------------------------------------------------------------------------


def domain_name(allocation_id: str, *, prefix: str = "berth-") -> str:
    """`berth-<allocation id>`, or, when the id has characters libvirt names should not carry or the name would pass
    64 characters, the cleaned and shortened name with a hash of the id, so two allocations never share a name."""
    if not allocation_id:
        raise ValueError("an allocation id is required to name its domain")
    plain = prefix + allocation_id
    cleaned = _NAME_UNSAFE.sub("-", plain)
    if cleaned == plain and len(plain) <= MAX_NAME_LENGTH:
        return plain
    digest = hashlib.sha256(allocation_id.encode()).hexdigest()[:8]
    return f"{cleaned[: MAX_NAME_LENGTH - len(digest) - 1]}-{digest}"


def domain_uuid(allocation_id: str) -> uuid.UUID:
    """A UUID5 of the allocation id in Berth's namespace: the same allocation finds the same domain again."""
    if not allocation_id:
        raise ValueError("an allocation id is required for its domain UUID")
    return uuid.uuid5(DOMAIN_NAMESPACE, allocation_id)


# PCI addresses and CPU sets ------------------------------------------------------------------------------------


class PciAddress(NamedTuple):
    domain: int
    bus: int
    slot: int
    function: int

    @classmethod
    def parse(cls, address: str) -> PciAddress:
        """`0000:3c:00.0` (or nvidia-smi's `00000000:3c:00.0`); ValueError for anything else."""
        try:
            domain, bus, rest = normalise_pci(address).split(":")
        except ValueError:
            raise ValueError(f"{address!r} is not a PCI address (expected dddd:bb:ss.f)") from None
        slot, function = rest.split(".")
        parsed = cls(int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16))
        if parsed.domain > 0xFFFF or parsed.slot > 0x1F:
            raise ValueError(f"{address!r} is not a PCI address (domain above ffff or slot above 1f)")
        return parsed

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"

    def attributes(self) -> dict[str, str]:
        """As libvirt writes an address: `domain='0x0000' bus='0x3c' slot='0x00' function='0x0'`."""
        return {
            "domain": f"0x{self.domain:04x}",
            "bus": f"0x{self.bus:02x}",
            "slot": f"0x{self.slot:02x}",
            "function": f"0x{self.function:x}",
        }


def format_cpuset(cpus: Iterable[int]) -> str:
    """`[0..23, 96..119]` -> `0-23,96-119`: libvirt's cpuset syntax, compact."""
    ordered = sorted(set(cpus))
    runs: list[list[int]] = []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def parse_cpuset(text: str) -> list[int]:
    """libvirt's cpuset syntax (`0-23,96-119`, with `^n` exclusions) -> the sorted CPU numbers."""
    included: set[int] = set()
    excluded: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        target = excluded if part.startswith("^") else included
        first, _, last = part.lstrip("^").partition("-")
        target.update(range(int(first), int(last or first) + 1))
    return sorted(included - excluded)


# The domain XML ------------------------------------------------------------------------------------------------


class DirectBoot(BaseModel):
    """A kernel and initrd booted directly, for an image whose disk has no boot loader (Berth's own test image);
    a cloud image boots from its own disk through the firmware and needs none of this."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel: Path
    initrd: Path | None = None
    cmdline: str = ""


class _Placement(NamedTuple):
    cpuset: str
    numa_node: int


def domain_xml(
    spec: VmSpec,
    config: DomainConfig,
    *,
    boot_disk: Path,
    seed_iso: Path,
    boot: DirectBoot | None = None,
    console_log: Path | None = None,
) -> str:
    """The `<domain>` document for one allocation: same spec, config and image, same bytes. `console_log`: where
    the serial console's output is kept (virtlogd writes it), so a boot that fails can be read afterwards."""
    if not spec.bundles:
        raise ValueError(f"allocation {spec.allocation_id}: a VM needs at least one bundle")
    paths = [(boot_disk, "boot disk"), (seed_iso, "seed ISO"), (console_log, "console log")]
    if boot is not None:
        paths += [(boot.kernel, "kernel"), (boot.initrd, "initrd")]
    for path, what in paths:
        if path is not None and not path.is_absolute():
            raise ValueError(f"the {what} path {str(path)!r} must be absolute (libvirt resolves nothing)")
    mac = _first_mac(spec)
    placement = _placement(spec.bundles, config)

    root = ET.Element("domain", {"type": config.domain_type})
    ET.SubElement(root, "name").text = domain_name(spec.allocation_id, prefix=config.name_prefix)
    ET.SubElement(root, "uuid").text = str(domain_uuid(spec.allocation_id))
    ET.SubElement(root, "memory", {"unit": "MiB"}).text = str(sum(b.memory_mib for b in spec.bundles))
    vcpu = ET.SubElement(root, "vcpu", {"placement": "static"})
    vcpu.text = str(sum(b.vcpu_count for b in spec.bundles))
    if placement is not None:
        vcpu.set("cpuset", placement.cpuset)
        numatune = ET.SubElement(root, "numatune")
        ET.SubElement(numatune, "memory", {"mode": "strict", "nodeset": str(placement.numa_node)})
    _os_and_features(root, config, boot)
    root.append(_devices(spec, config, mac, boot_disk=boot_disk, seed_iso=seed_iso, console_log=console_log))

    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _first_mac(spec: VmSpec) -> str:
    """The NIC's MAC comes from the plan (the slot's MAC/IP identity), never from libvirt's random choice."""
    mac = spec.bundles[0].mac_address
    if not mac:
        raise ValueError(
            f"allocation {spec.allocation_id}: bundle for slot {spec.bundles[0].slot_index} has no MAC address; "
            "the plan must carry the slot's MAC"
        )
    normalised = mac.strip().lower()
    if not _MAC.match(normalised):
        raise ValueError(f"allocation {spec.allocation_id}: {mac!r} is not a MAC address")
    return normalised


def _placement(bundles: Sequence[Bundle], config: DomainConfig) -> _Placement | None:
    """Pin to a NUMA node only when the whole plan is on it; a node the firmware did not give (-1) pins nothing."""
    nodes = {bundle.numa_node for bundle in bundles}
    if len(nodes) != 1:
        return None
    (node,) = nodes
    if node < 0:
        return None
    cpus = config.host_cpus_by_numa.get(node)
    if not cpus:
        raise ValueError(
            f"every bundle is on NUMA node {node}, but the agent's host_cpus_by_numa has no CPUs for it "
            f"(it has nodes {sorted(config.host_cpus_by_numa)}): cannot pin the VM to its node"
        )
    return _Placement(cpuset=format_cpuset(cpus), numa_node=node)


def _os_and_features(root: ET.Element, config: DomainConfig, boot: DirectBoot | None) -> None:
    os_ = ET.SubElement(root, "os", {"firmware": "efi"} if config.firmware == "efi" else {})
    ET.SubElement(os_, "type", {"arch": "x86_64", "machine": config.machine}).text = "hvm"
    if boot is None:
        ET.SubElement(os_, "boot", {"dev": "hd"})
    else:
        ET.SubElement(os_, "kernel").text = str(boot.kernel)
        if boot.initrd is not None:
            ET.SubElement(os_, "initrd").text = str(boot.initrd)
        if boot.cmdline:
            ET.SubElement(os_, "cmdline").text = boot.cmdline
    features = ET.SubElement(root, "features")
    ET.SubElement(features, "acpi")
    ET.SubElement(features, "apic")
    if config.domain_type == "kvm":
        # The host's CPU as it is: what GPU drivers and CUDA expect. TCG cannot pass a CPU through: QEMU's default
        # model then, which every x86-64 kernel boots on.
        ET.SubElement(root, "cpu", {"mode": "host-passthrough"})
    ET.SubElement(root, "clock", {"offset": "utc"})
    ET.SubElement(root, "on_poweroff").text = "destroy"
    ET.SubElement(root, "on_reboot").text = "restart"
    ET.SubElement(root, "on_crash").text = "destroy"


def _devices(
    spec: VmSpec, config: DomainConfig, mac: str, *, boot_disk: Path, seed_iso: Path, console_log: Path | None
) -> ET.Element:
    devices = ET.Element("devices")
    if config.emulator:
        ET.SubElement(devices, "emulator").text = config.emulator
    devices.append(_file_disk("qcow2", boot_disk, target="vda"))
    nvme = _nvme_disks(spec.bundles) if config.passthrough else []
    devices.extend(nvme)
    # The seed is a read-only virtio disk, not a cdrom: a cdrom on q35 is SATA (AHCI), a driver cloud kernels leave
    # out (Debian's cloud kernel boots without it and cloud-init then never finds its seed), while every cloud
    # image has virtio-blk. NoCloud finds the seed by its label on any block device.
    seed_target = "vd" + _disk_letters(len(nvme) + 1)
    devices.append(_file_disk("raw", seed_iso, target=seed_target, readonly=True, serial=SEED_SERIAL))
    if config.passthrough:
        for bus in range(1, 2 * len(spec.bundles) + 1):
            devices.append(_root_port(bus))
        for position, bundle in enumerate(spec.bundles):
            for hostdev in _bundle_hostdevs(position, bundle):
                devices.append(hostdev)
    devices.append(_interface(config, mac))
    channel = ET.SubElement(devices, "channel", {"type": "unix"})
    ET.SubElement(channel, "target", {"type": "virtio", "name": GUEST_AGENT_CHANNEL})
    serial = ET.SubElement(devices, "serial", {"type": "pty"})
    if console_log is not None:  # virtlogd keeps a copy of everything the console prints
        ET.SubElement(serial, "log", {"file": str(console_log), "append": "off"})
    ET.SubElement(devices, "console", {"type": "pty"})
    ET.SubElement(devices, "memballoon", {"model": "none"})
    return devices


def _file_disk(fmt: str, path: Path, *, target: str, readonly: bool = False, serial: str | None = None) -> ET.Element:
    disk = ET.Element("disk", {"type": "file", "device": "disk"})
    ET.SubElement(disk, "driver", {"name": "qemu", "type": fmt})
    ET.SubElement(disk, "source", {"file": str(path)})
    ET.SubElement(disk, "target", {"dev": target, "bus": "virtio"})
    if readonly:
        ET.SubElement(disk, "readonly")
    if serial is not None:
        ET.SubElement(disk, "serial").text = serial
    return disk


def _nvme_disks(bundles: Sequence[Bundle]) -> list[ET.Element]:
    """Raw NVMe namespaces, uncached and with native AIO: the guest owns the device, the host must not buffer it."""
    disks: list[ET.Element] = []
    for bundle in bundles:
        if bundle.nvme_device is None:
            continue
        if not bundle.nvme_device.startswith("/"):
            raise ValueError(f"slot {bundle.slot_index}: NVMe device {bundle.nvme_device!r} is not an absolute path")
        disk = ET.Element("disk", {"type": "block", "device": "disk"})
        ET.SubElement(disk, "driver", {"name": "qemu", "type": "raw", "cache": "none", "io": "native"})
        ET.SubElement(disk, "source", {"dev": bundle.nvme_device})
        ET.SubElement(disk, "target", {"dev": "vd" + _disk_letters(len(disks) + 1), "bus": "virtio"})
        ET.SubElement(disk, "serial").text = f"berth-slot-{bundle.slot_index}"
        disks.append(disk)
    return disks


def _disk_letters(index: int) -> str:
    """0 -> `a`, 25 -> `z`, 26 -> `aa`: the kernel's disk suffixes."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return letters


def gpu_guest_bus(position: int) -> int:
    """The libvirt bus (root-port index) of the GPU of the bundle at `position` in the plan."""
    return 2 * position + 1


def vf_guest_bus(position: int) -> int:
    """The libvirt bus (root-port index) of the fabric VF of the bundle at `position` in the plan."""
    return 2 * position + 2


def _root_port(bus: int) -> ET.Element:
    """The pcie-root-port that provides `bus`, itself pinned on pcie.0, eight to a multifunction slot."""
    slot, function = divmod(bus - 1, _ROOT_PORTS_PER_SLOT)
    slot += _FIRST_ROOT_PORT_SLOT
    if slot > _LAST_ROOT_PORT_SLOT:
        raise ValueError(f"bus {bus}: too many bundles for the root-port layout")
    controller = ET.Element("controller", {"type": "pci", "model": "pcie-root-port", "index": str(bus)})
    address = {"type": "pci", **PciAddress(0, 0, slot, function).attributes()}
    if function == 0:
        address["multifunction"] = "on"
    ET.SubElement(controller, "address", address)
    return controller


def _bundle_hostdevs(position: int, bundle: Bundle) -> list[ET.Element]:
    try:
        hostdevs = [_hostdev(PciAddress.parse(bundle.gpu_pci), gpu_guest_bus(position))]
        if bundle.fabric_vf_pci is not None:
            hostdevs.append(_hostdev(PciAddress.parse(bundle.fabric_vf_pci), vf_guest_bus(position)))
    except ValueError as error:
        raise ValueError(f"slot {bundle.slot_index}: {error}") from None
    return hostdevs


def _hostdev(source: PciAddress, guest_bus: int) -> ET.Element:
    hostdev = ET.Element("hostdev", {"mode": "subsystem", "type": "pci", "managed": "yes"})
    ET.SubElement(ET.SubElement(hostdev, "source"), "address", source.attributes())
    ET.SubElement(hostdev, "address", {"type": "pci", **PciAddress(0, guest_bus, 0, 0).attributes()})
    return hostdev


def _interface(config: DomainConfig, mac: str) -> ET.Element:
    kind, name = ("network", config.network) if config.network is not None else ("bridge", config.bridge)
    interface = ET.Element("interface", {"type": kind})
    ET.SubElement(interface, "mac", {"address": mac})
    ET.SubElement(interface, "source", {kind: str(name)})
    ET.SubElement(interface, "model", {"type": "virtio"})
    return interface


# Reading a domain back -----------------------------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class PciHostdev(_Frozen):
    source: str  # the host function, `0000:3c:00.0`
    guest: str | None  # the pinned guest address in the same form, None when libvirt has not placed it


class BlockDisk(_Frozen):
    source: str  # the host block device
    target: str | None
    serial: str | None


class DomainFacts(_Frozen):
    """What a test or an operator checks in a domain's XML, as Berth wrote it or as libvirt returns it (`0x3c`
    addresses, memory in KiB, aliases and controllers it added): addresses normalised to `0000:3c:00.0`, memory in
    MiB, CPU sets in compact form."""

    name: str
    uuid: uuid.UUID
    memory_mib: int
    vcpus: int
    cpuset: str | None
    numa_nodeset: str | None
    numa_mode: str | None
    hostdevs: list[PciHostdev]
    block_disks: list[BlockDisk]
    boot_disk: str | None
    seed_iso: str | None
    mac: str | None
    network: str | None
    bridge: str | None
    has_guest_agent: bool

    @property
    def hostdev_sources(self) -> list[str]:
        return [hostdev.source for hostdev in self.hostdevs]


_MEMORY_UNITS = {
    "b": 1,
    "bytes": 1,
    "kb": 1000,
    "k": 1024,
    "kib": 1024,
    "mb": 1000**2,
    "m": 1024**2,
    "mib": 1024**2,
    "gb": 1000**3,
    "g": 1024**3,
    "gib": 1024**3,
    "tb": 1000**4,
    "t": 1024**4,
    "tib": 1024**4,
}


def parse_domain(xml: str) -> DomainFacts:
    """The facts of a domain XML; ValueError when it is not a domain or lacks a name, UUID, memory or vCPUs."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as error:
        raise ValueError(f"not XML: {error}") from None
    if root.tag != "domain":
        raise ValueError(f"not a libvirt domain: the root element is <{root.tag}>")
    vcpu = _required(root, "vcpu")
    cpuset = vcpu.get("cpuset")
    numa = root.find("numatune/memory")
    nodeset = numa.get("nodeset") if numa is not None else None
    interface = root.find("devices/interface")
    mac = interface.find("mac") if interface is not None else None
    mac_address = mac.get("address") if mac is not None else None
    source = interface.find("source") if interface is not None else None
    return DomainFacts(
        name=_text(_required(root, "name")),
        uuid=uuid.UUID(_text(_required(root, "uuid"))),
        memory_mib=_memory_mib(_required(root, "memory")),
        vcpus=int(_text(vcpu)),
        cpuset=format_cpuset(parse_cpuset(cpuset)) if cpuset else None,
        numa_nodeset=format_cpuset(parse_cpuset(nodeset)) if nodeset else None,
        numa_mode=numa.get("mode", "strict") if numa is not None else None,
        hostdevs=_hostdevs(root),
        block_disks=_block_disks(root),
        boot_disk=_file_disk_source(root, seed=False),
        seed_iso=_file_disk_source(root, seed=True),
        mac=mac_address.lower() if mac_address else None,
        network=source.get("network") if source is not None else None,
        bridge=source.get("bridge") if source is not None else None,
        has_guest_agent=any(
            target.get("type") == "virtio" and target.get("name") == GUEST_AGENT_CHANNEL
            for target in root.iterfind("devices/channel/target")
        ),
    )


def _required(root: ET.Element, path: str) -> ET.Element:
    element = root.find(path)
    if element is None:
        raise ValueError(f"the domain has no <{path}>")
    return element


def _text(element: ET.Element) -> str:
    return (element.text or "").strip()


def _memory_mib(element: ET.Element) -> int:
    unit = element.get("unit", "KiB").lower()
    if unit not in _MEMORY_UNITS:
        raise ValueError(f"unknown memory unit {unit!r}")
    return int(_text(element)) * _MEMORY_UNITS[unit] // 1024**2


def _number(value: str | None) -> int:
    """libvirt writes PCI address parts as `0x3c`; decimal is also valid input."""
    if value is None:
        return 0
    value = value.strip().lower()
    return int(value, 16) if value.startswith("0x") else int(value, 10)


def _address(element: ET.Element | None) -> str | None:
    if element is None:
        return None
    parts = (element.get(name) for name in ("domain", "bus", "slot", "function"))
    return str(PciAddress(*(_number(part) for part in parts)))


def _hostdevs(root: ET.Element) -> list[PciHostdev]:
    found: list[PciHostdev] = []
    for hostdev in root.iterfind("devices/hostdev"):
        if hostdev.get("mode", "subsystem") != "subsystem" or hostdev.get("type") != "pci":
            continue
        source = _address(hostdev.find("source/address"))
        if source is None:
            continue
        guest = hostdev.find("address")
        guest_pci = _address(guest) if guest is not None and guest.get("type") == "pci" else None
        found.append(PciHostdev(source=source, guest=guest_pci))
    return found


def _block_disks(root: ET.Element) -> list[BlockDisk]:
    found: list[BlockDisk] = []
    for disk in root.iterfind("devices/disk"):
        source = disk.find("source")
        if disk.get("type") != "block" or source is None or not source.get("dev"):
            continue
        target = disk.find("target")
        serial = _text(disk.find("serial")) if disk.find("serial") is not None else ""
        found.append(
            BlockDisk(
                source=source.get("dev", ""),
                target=target.get("dev") if target is not None else None,
                serial=serial or None,
            )
        )
    return found


def _file_disk_source(root: ET.Element, *, seed: bool) -> str | None:
    """The boot disk (the first file disk that is not the seed) or the seed (its serial, or a cdrom as older
    domains carried it)."""
    for disk in root.iterfind("devices/disk"):
        source = disk.find("source")
        if disk.get("type") != "file" or source is None:
            continue
        is_seed = disk.findtext("serial") == SEED_SERIAL or disk.get("device") == "cdrom"
        if is_seed == seed:
            return source.get("file")
    return None
