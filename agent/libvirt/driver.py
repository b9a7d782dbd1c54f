"""The libvirt `VmDriver`: one domain per allocation, carrying out the node scheduler's plan as it is.

    create:  resolve the image (catalogue) -> copy-on-write overlay in the storage pool -> NoCloud seed ISO ->
             define the domain (plan's GPUs and VFs as managed hostdevs, raw NVMe as block disks, MAC, vCPUs and
             memory, NUMA pinning, guest agent, the serial console kept in a file) -> start it. Any failure undoes
             what was made: never a half-made VM.
    get/list: the domains carrying Berth's metadata (the allocation, its slots and addresses) survive agent restarts;
              a domain named `berth-<allocation>` without it is listed too (the reconciler judges it).
    readiness: the named gates of `readiness.py`, on the plan's address or the one libvirt's DHCP lease gave.
    guest_signals: each ready guest's GPUs; a domain that stopped (its QEMU killed, a crash, a poweroff inside) is
             a failed GPU reading for each of its slots, so the allocation's health and replacement path runs.
    destroy: destroy, undefine, delete the overlay, the seed and the console log; idempotent.
    wipe:    each released slot's NVMe erased and GPU reset (`host/wipe.py`); nothing where nothing was passed through.

The accelerator is chosen per host (`choose_accelerator`): KVM where it is usable, TCG where it is not or where the
operator says so; `runtime()` says which, and the agent's host report carries that line. A host with no GPU to pass
through (`passthrough: false`) keeps its GPUs as bookkeeping only: nothing is attached and the `gpus` gate is skipped,
saying so. libvirtd may restart under the agent: the connection is reopened when it is found dead, and an error of
the connection itself is a `VmRuntimeUnavailable` (retried), not a failed create.

Domain name and UUID derive from the allocation id, so a second `create` finds the first domain instead of making
another. libvirt-python is synchronous: the agent calls it from its activity threads.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from agent.drivers import ImageNotFound, VmCreateError, VmRecord, VmRuntimeUnavailable
from agent.host.wipe import HostRunner, SlotWipe, SubprocessRunner, wipe_slot
from agent.libvirt.domain import DirectBoot, DomainConfig, domain_name, domain_xml, parse_domain
from agent.libvirt.guest import GuestAgent, LibvirtGuestAgent
from agent.libvirt.guest_health import GuestHealthWatch
from agent.libvirt.readiness import Gates, GateState
from agent.libvirt.seed import GuestInterface, SeedConfig, write_seed_iso
from contracts.allocation import Readiness, VmSpec, cloud_config
from fleet.node import Slot
from scheduler.host.health import DriverSignals

log = logging.getLogger("berth.agent")

METADATA_NS = "https://berth.dev/xmlns/allocation/1"
CONSOLE_LINES = 12  # how much of a failed boot's console the readiness report carries
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
DOMAIN_PREFIX = "berth-"  # domain_name()'s default
GIB = 1024**3


class CatalogueImage(BaseModel):
    """One image of the catalogue: its base disk (qcow2), and a kernel and initrd to boot it with when its disk has
    no boot loader of its own. A cloud image (Debian's, Ubuntu's) boots from its disk and names only `disk`."""

    model_config = {"extra": "forbid", "frozen": True}

    disk: str
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str = ""

    @model_validator(mode="after")
    def _kernel_for_initrd(self) -> CatalogueImage:
        if self.kernel is None and (self.initrd is not None or self.cmdline):
            raise ValueError("an initrd or a kernel command line needs a kernel")
        return self

    def direct_boot(self) -> DirectBoot | None:
        if self.kernel is None:
            return None
        initrd = Path(self.initrd) if self.initrd else None
        return DirectBoot(kernel=Path(self.kernel), initrd=initrd, cmdline=self.cmdline)


ImageEntry = str | CatalogueImage  # a plain path is a disk that boots itself


class ImageCatalogue(BaseModel):
    """The operator's image catalogue file (YAML): `images: {name: /path/to/base.qcow2}` (or `{name: {disk: ...,
    kernel: ..., initrd: ..., cmdline: ...}}` for an image booted directly) and an optional `default`."""

    model_config = {"extra": "forbid", "frozen": True}

    images: dict[str, ImageEntry] = Field(default_factory=dict)
    default: str | None = None

    @model_validator(mode="after")
    def _default_is_known(self) -> ImageCatalogue:
        if self.default is not None and self.default not in self.images:
            raise ValueError(f"the default image {self.default!r} is not one of the catalogue's images")
        return self

    @classmethod
    def load(cls, path: Path) -> ImageCatalogue:
        return cls.model_validate(yaml.safe_load(path.read_text()) or {})


class LibvirtSettings(BaseModel):
    """What an operator configures on a host agent (`berth worker node --runtime libvirt`, `BERTH_LIBVIRT_*`)."""

    uri: str = "qemu:///system"
    storage_pool: str = Field(default="default", description="The libvirt storage pool overlays are made in.")
    images: dict[str, ImageEntry] = Field(
        default_factory=dict,
        description="The image catalogue: image name -> path of its base image (qcow2), or a disk with a kernel.",
    )
    default_image: str | None = Field(default=None, description="The image of a request that names none.")
    network: str | None = Field(default="default", description="The libvirt network the VM's interface joins.")
    bridge: str | None = Field(default=None, description="A host bridge instead of a libvirt network.")
    seed_dir: Path = Field(description="Where cloud-init seed ISOs and console logs are written (readable by QEMU).")
    disk_gib: int = Field(default=100, ge=1, description="Size of the VM's boot disk (the overlay).")
    ssh_port: int = Field(default=22, ge=1, le=65535, description="The port the `ssh` readiness gate connects to.")
    accelerator: Literal["auto", "kvm", "tcg"] = Field(
        default="auto",
        description="KVM, TCG (software emulation), or `auto`: KVM where /dev/kvm opens and libvirt offers it.",
    )
    passthrough: bool = Field(
        default=True,
        description="Attach the plan's GPUs, VFs and NVMe. False on a host with none to pass through: its GPUs are "
        "bookkeeping only and the `gpus` gate is skipped.",
    )
    firmware: Literal["efi", "bios"] = Field(default="efi", description="The guest firmware (see domain.py).")
    guest_addressing: Literal["static", "dhcp"] = Field(
        default="static",
        description="`static`: the plan's private IP is written into the seed. `dhcp`: the guest asks the network, "
        "and the readiness gates use the address libvirt's DHCP lease (or the guest agent, on a bridge) reports.",
    )

    @classmethod
    def load(cls, path: Path, **overrides: object) -> LibvirtSettings:
        """The settings from a YAML file (`berth worker node|agents --libvirt-config`), command-line values over it."""
        document = yaml.safe_load(path.read_text()) or {}
        if not isinstance(document, dict):
            raise ValueError(f"{path}: a libvirt config is a mapping of settings, not {type(document).__name__}")
        given = {key: value for key, value in overrides.items() if value is not None}
        return cls.model_validate({**document, **given})

    @model_validator(mode="after")
    def _one_network(self) -> LibvirtSettings:
        if self.bridge is not None:
            object.__setattr__(self, "network", None)
        if self.network is None and self.bridge is None:
            raise ValueError("give a libvirt network or a bridge for the VMs' interface")
        return self


class LibvirtVmDriver:
    def __init__(
        self,
        settings: LibvirtSettings,
        host_cpus_by_numa: dict[int, list[int]],
        connection: Any | None = None,
        guest_agent: GuestAgent | None = None,
        clock: Callable[[], float] = time.time,
        runner: HostRunner | None = None,
        node: str | None = None,
    ) -> None:
        import libvirt

        self.settings = settings
        self.node = node  # this agent's node: a domain another node's agent made on a shared libvirt is not ours
        libvirt.registerErrorHandler(lambda _context, _error: None, None)  # errors are raised; libvirt need not print
        self._connection = connection or libvirt.open(settings.uri)
        guest = guest_agent or LibvirtGuestAgent(lambda: self.connection)
        self.gates = Gates(guest, ssh_port=settings.ssh_port, skip_gpus=not settings.passthrough)
        self.guest = GuestHealthWatch(guest)
        self._ready: set[str] = set()  # domains whose readiness gates all passed: their guest answers now
        self.clock = clock
        self.runner = runner or SubprocessRunner()
        self.domain_type, self.accelerator_reason = choose_accelerator(self.connection, settings.accelerator)
        self.domain_config = DomainConfig(
            domain_type=self.domain_type,
            passthrough=settings.passthrough,
            firmware=settings.firmware,
            network=settings.network,
            bridge=settings.bridge,
            storage_pool_path=self._pool_path(),
            host_cpus_by_numa=host_cpus_by_numa,
        )

    @property
    def connection(self) -> Any:
        """The libvirt connection, reopened when libvirtd restarted under it (a dead connection stays dead). A
        connection whose daemon went away can still say it is alive until a call fails on its socket, so a cheap call
        (the library version, answered by libvirtd) is the test."""
        import libvirt

        try:
            alive = bool(self._connection.isAlive()) and self._connection.getLibVersion() > 0
        except libvirt.libvirtError:
            alive = False
        if not alive:
            log.warning("the libvirt connection to %s is gone (libvirtd restarted?): reconnecting", self.settings.uri)
            try:
                self._connection = libvirt.open(self.settings.uri)
            except libvirt.libvirtError as error:
                raise VmRuntimeUnavailable(f"libvirt at {self.settings.uri} is not answering: {error}") from error
        return self._connection

    def runtime(self) -> str:
        """One line for the host report: which hypervisor, which accelerator and why, and whether GPUs pass through."""
        accelerator = "KVM" if self.domain_type == "kvm" else "TCG (software emulation, no KVM)"
        gpus = "GPUs passed through" if self.settings.passthrough else "GPUs bookkeeping only (no passthrough)"
        return f"libvirt {self.settings.uri}: {accelerator}: {self.accelerator_reason}; {gpus}"

    # create ------------------------------------------------------------------------------------------------------

    def ready_when_created(self) -> bool:
        return False  # a guest boots (tens of seconds with KVM, minutes with TCG) before any gate can pass

    def create(self, spec: VmSpec) -> VmRecord:
        name = domain_name(spec.allocation_id)
        domain = self._lookup(name)
        if domain is not None:  # made before (a retried activity, an agent restart): make sure it runs
            if not domain.isActive():
                domain.create()
            record = _record_of(domain.XMLDesc(0))
            if record is not None:
                return record
        image = self._image(spec.image)
        self._delete_volume(f"{name}.qcow2")  # an overlay left by a create that died half-way: start clean
        made: list[Callable[[], None]] = []
        try:
            overlay = self._overlay(name, image.disk)
            made.append(lambda: self._delete_volume(f"{name}.qcow2"))
            seed = write_seed_iso(self._seed_config(spec, name), self._seed_path(name))
            made.append(lambda: seed.unlink(missing_ok=True))
            record = VmRecord(
                vm_id=name,
                allocation_id=spec.allocation_id,
                node=spec.node,
                slot_indexes=[bundle.slot_index for bundle in spec.bundles],
                private_ips=[bundle.private_ip for bundle in spec.bundles if bundle.private_ip],
                created_at=self.clock(),
            )
            xml = domain_xml(
                spec,
                self.domain_config,
                boot_disk=overlay,
                seed_iso=seed,
                boot=image.direct_boot(),
                console_log=self._console_path(name),
            )
            domain = self.connection.defineXML(_with_metadata(xml, record))
            made.append(lambda: _undefine(domain))
            domain.create()
        except Exception as error:
            for undo in reversed(made):
                _quietly(undo)
            if isinstance(error, VmCreateError):
                raise
            if _connection_lost(error):  # libvirtd went away mid-create: retried once it is back, never a failure
                raise VmRuntimeUnavailable(f"libvirt lost its connection while creating {name}: {error}") from error
            raise VmCreateError(f"libvirt could not create {name}: {error}") from error
        return record

    def _image(self, requested: str | None) -> CatalogueImage:
        image = requested or self.settings.default_image
        if image is None:
            raise ImageNotFound("the request names no image and the node has no default image")
        if image not in self.settings.images:
            known = ", ".join(sorted(self.settings.images)) or "none"
            raise ImageNotFound(f"image {image!r} is not in this node's catalogue (known: {known})")
        entry = self.settings.images[image]
        return entry if isinstance(entry, CatalogueImage) else CatalogueImage(disk=entry)

    def _seed_path(self, name: str) -> Path:
        return self.settings.seed_dir / f"{name}-seed.iso"

    def _console_path(self, name: str) -> Path:
        return self.settings.seed_dir / f"{name}-console.log"

    def _overlay(self, name: str, base: str) -> Path:
        pool = self.connection.storagePoolLookupByName(self.settings.storage_pool)
        volume = ET.Element("volume")
        ET.SubElement(volume, "name").text = f"{name}.qcow2"
        ET.SubElement(volume, "capacity", unit="bytes").text = str(self.settings.disk_gib * GIB)
        ET.SubElement(ET.SubElement(volume, "target"), "format", type="qcow2")
        backing = ET.SubElement(volume, "backingStore")
        ET.SubElement(backing, "path").text = base
        ET.SubElement(backing, "format", type="qcow2")
        return Path(pool.createXML(ET.tostring(volume, encoding="unicode"), 0).path())

    def _seed_config(self, spec: VmSpec, name: str) -> SeedConfig:
        """One NIC (the first bundle's MAC) carrying every bundle's private IP (DHCP when the plan has none)."""
        first = spec.bundles[0]
        addresses = [bundle.private_ip for bundle in spec.bundles if bundle.private_ip]
        if self.settings.guest_addressing == "dhcp":
            addresses = []  # the network hands the address out (a reservation for the slot's MAC, or its range)
        nic = GuestInterface(
            mac=first.mac_address or "", address=addresses[0] if addresses else None, extra_addresses=addresses[1:]
        )
        try:
            extra = cloud_config(spec.user_data) if spec.user_data else None
            return SeedConfig(
                instance_id=spec.allocation_id,
                hostname=name,
                ssh_public_keys=list(spec.ssh_public_keys),
                interfaces=[nic],
                user_data_extra=extra,
            )
        except ValueError as error:  # the API checks user-data first; this is the agent's own guard
            raise VmCreateError(f"the allocation's user-data cannot go into the seed: {error}") from error

    # read ---------------------------------------------------------------------------------------------------------

    def get(self, allocation_id: str) -> VmRecord | None:
        domain = self._lookup(domain_name(allocation_id))
        return self._record(domain) if domain is not None else None

    def list(self) -> list[VmRecord]:
        """Every domain named for an allocation: Berth's own (their metadata says which allocation and slots) and any
        other named `berth-<allocation>` (defined by hand, or its metadata lost), which the reconciler must see too."""
        records = (self._record(domain) for domain in self.connection.listAllDomains(0))
        return sorted((record for record in records if record is not None), key=lambda r: r.allocation_id)

    def _record(self, domain: Any) -> VmRecord | None:
        """The domain's record; None for a domain that is not Berth's, or that was undefined since it was listed
        (another allocation's teardown runs beside every listing)."""
        import libvirt

        try:
            xml = domain.XMLDesc(0)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise
        record = _record_of(xml)
        if record is not None:
            mine = self.node is None or record.node in (None, self.node)
            return record if mine else None
        name = domain.name()
        allocation = name.removeprefix(DOMAIN_PREFIX)
        if name == allocation or not allocation or domain_name(allocation) != name:
            return None  # not named for an allocation: not Berth's business
        # No metadata: its slots are unknown, and its age too (so the reconciler's grace counts from now).
        return VmRecord(vm_id=name, allocation_id=allocation, slot_indexes=[], created_at=self.clock())

    def readiness(self, allocation_id: str, gpu_count: int) -> Readiness:
        domain = self._lookup(domain_name(allocation_id))
        record = self._record(domain) if domain is not None else None
        if domain is None or record is None:
            return Readiness(ssh=False, cloud_init=False, nvidia_smi=False, detail="no such VM")
        if not domain.isActive():  # it will not come up by waiting: say so now, with what its console last said
            stopped = f"the VM stopped while booting ({_stop_reason(domain)})"
            return Readiness(
                ssh=False,
                cloud_init=False,
                nvidia_smi=False,
                detail=stopped,
                failed_gate="vm",
                failure=stopped,
                console=self.console_tail(allocation_id),
            )
        address, where = self._address(domain, record)
        probes = self.gates.probe(record.vm_id, address, gpu_count, no_address=where)
        results = {gate.name: gate for gate in probes}
        failed = next((gate for gate in results.values() if gate.state is GateState.FAILED), None)
        ready = all(gate.state is GateState.PASSED for gate in results.values())
        if ready:
            self._ready.add(record.vm_id)
        return Readiness(
            ssh=results["ssh"].state is GateState.PASSED,
            cloud_init=results["cloud_init"].state is GateState.PASSED,
            nvidia_smi=results["gpus"].state is GateState.PASSED,
            detail="; ".join(f"{gate.name}: {gate.message}" for gate in results.values()),
            failed_gate=failed.name if failed else None,
            failure=failed.message if failed else None,
            address=address,
            console=[] if ready else self.console_tail(allocation_id),
        )

    def _address(self, domain: Any, record: VmRecord) -> tuple[str | None, str]:
        """The address the gates reach the VM on, and, when there is none yet, why. `static`: the plan's. `dhcp`:
        the newest lease libvirt's network holds for the VM's MAC (or, on a host bridge, what the guest agent
        reports); when the plan also names an address, a lease for another one is not taken for it."""
        planned = _first(record.private_ips)
        if self.settings.guest_addressing == "static":
            return planned, "the plan gives the VM no address"
        mac = parse_domain(domain.XMLDesc(0)).mac
        if mac is None:
            return None, "the VM has no NIC"
        leased = self._leased_address(domain, mac)
        where = f"network {self.settings.network}" if self.settings.network else "the guest agent"
        if leased is None:
            return None, f"no DHCP lease for {mac} on {where} yet"
        if planned is not None and leased != planned:
            return None, f"{where} gave {mac} the address {leased}, but the plan's address is {planned}"
        return leased, ""

    def _leased_address(self, domain: Any, mac: str) -> str | None:
        import libvirt

        try:
            if self.settings.network is not None:
                leases = self.connection.networkLookupByName(self.settings.network).DHCPLeases(mac)
                ipv4 = [lease for lease in leases if lease.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4]
                newest = max(ipv4, key=lambda lease: lease.get("expirytime", 0), default=None)
                return newest["ipaddr"] if newest else None
            interfaces = domain.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
        except libvirt.libvirtError:
            return None  # no network, a guest agent not up yet: no address yet
        for interface in interfaces.values():
            if (interface.get("hwaddr") or "").lower() != mac:
                continue
            for address in interface.get("addrs") or []:
                if address.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4:
                    return str(address["addr"])
        return None

    def console_tail(self, allocation_id: str, lines: int = CONSOLE_LINES) -> list[str]:
        """The serial console's last lines (what a boot that failed printed last), cleaned of terminal colours."""
        return read_console_tail(self._console_path(domain_name(allocation_id)), lines)

    # destroy ------------------------------------------------------------------------------------------------------

    def destroy(self, allocation_id: str) -> bool:
        """Stop and remove the domain (its NVRAM too: UEFI domains have one), then the overlay and the seed. Only a
        domain that is already gone is ignored; any other libvirt error is raised, so the teardown is retried and the
        slots are never wiped or freed under a VM that still holds them."""
        name = domain_name(allocation_id)
        domain = self._lookup(name)
        if domain is not None:
            if domain.isActive():
                _destroy_running(domain)
            _undefine(domain)
        self._delete_volume(f"{name}.qcow2")
        self._seed_path(name).unlink(missing_ok=True)
        self._console_path(name).unlink(missing_ok=True)
        self.gates.forget(name)
        self.guest.forget(name)
        self._ready.discard(name)
        return domain is not None

    def _lookup(self, name: str) -> Any | None:
        import libvirt

        try:
            return self.connection.lookupByName(name)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise

    def guest_signals(self) -> dict[int, DriverSignals]:
        """Each VM's guest, once it has been ready (or, after an agent restart, once it is older than the guest
        check's interval): a guest still booting is not asked, so a boot is never read as a GPU of unknown health."""
        found: dict[int, DriverSignals] = {}
        for domain in self.connection.listAllDomains(0):
            record = self._record(domain)
            if record is None or not record.slot_indexes:
                continue
            if not _is_active(domain):
                # Its QEMU is gone (killed, crashed, powered off inside): the allocation's GPUs are lost to it now,
                # not at its release. Told as the GPUs' reading, so its health and replacement path runs.
                stopped = f"the VM {record.vm_id} is not running ({_stop_reason(domain)})"
                found.update(
                    (index, DriverSignals(answered=False, vm_stopped=stopped)) for index in record.slot_indexes
                )
                continue
            if not self.settings.passthrough:
                continue  # no GPU inside to ask about
            booted = record.vm_id in self._ready or self.clock() - record.created_at >= self.guest.interval
            if not booted:
                continue
            readings = self.guest.look(record.vm_id, len(record.slot_indexes))
            found.update(zip(record.slot_indexes, readings, strict=False))
        return found

    def wipe(self, slots: list[Slot]) -> list[SlotWipe]:
        """Each slot's NVMe erased and GPU reset; nothing on a host whose GPUs are bookkeeping only: its slots name
        devices it does not have, and what no VM was given needs no scrubbing (a reset of an absent GPU would fail
        and quarantine the slot for nothing)."""
        if not self.settings.passthrough:
            return [SlotWipe(index=slot.index) for slot in slots]
        return [wipe_slot(slot, self.runner) for slot in slots]

    # helpers ------------------------------------------------------------------------------------------------------

    def _pool_path(self) -> Path:
        pool = self.connection.storagePoolLookupByName(self.settings.storage_pool)
        return Path(ET.fromstring(pool.XMLDesc(0)).findtext("target/path") or "/")

    def _delete_volume(self, volume: str) -> None:
        import libvirt

        try:
            self.connection.storagePoolLookupByName(self.settings.storage_pool).storageVolLookupByName(volume).delete(0)
        except libvirt.libvirtError:
            pass


def choose_accelerator(connection: Any, requested: str) -> tuple[Literal["kvm", "qemu"], str]:
    """The domain type for this host and why: `kvm` when asked for or, under `auto`, when /dev/kvm opens and libvirt
    offers KVM for x86_64; `qemu` (TCG) when asked for or when KVM is not there. `kvm` asked for on a host without
    it is an error at start, never a silent fallback to software emulation."""
    if requested == "tcg":
        return "qemu", "configured (accelerator: tcg)"
    usable, why = _kvm_usable(connection)
    if usable:
        return "kvm", "configured (accelerator: kvm)" if requested == "kvm" else "/dev/kvm opens and libvirt offers it"
    if requested == "kvm":
        raise VmCreateError(f"accelerator kvm is configured, but KVM is not usable on this host: {why}")
    return "qemu", f"KVM is not usable here ({why})"


def _kvm_usable(connection: Any) -> tuple[bool, str]:
    import libvirt

    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError as error:
        return False, f"/dev/kvm: {error.strerror or error}"
    try:
        connection.getDomainCapabilities(None, "x86_64", None, "kvm", 0)
    except libvirt.libvirtError as error:
        return False, f"libvirt offers no KVM domain: {error.get_error_message()}"
    return True, ""


_STOP_REASONS = {
    1: "shut down from inside",
    2: "destroyed",
    3: "crashed: its QEMU process ended unexpectedly or was killed",
    4: "migrated away",
    5: "saved",
    6: "failed to start",
    7: "restored from a snapshot",
    8: "stopped by libvirtd while it reconnected to it",
}


def _destroy_running(domain: Any) -> None:
    """Stop a running domain; one that stopped on its own since it was looked at is as good."""
    import libvirt

    try:
        domain.destroy()
    except libvirt.libvirtError as error:
        if error.get_error_code() != libvirt.VIR_ERR_OPERATION_INVALID or domain.isActive():
            raise


def _is_active(domain: Any) -> bool:
    """Whether the domain runs; an undefined domain (its teardown ran since it was listed) counts as running, since
    a teardown, not a death, ended it."""
    import libvirt

    try:
        return bool(domain.isActive())
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return True
        raise


def _stop_reason(domain: Any) -> str:
    """libvirt's word for why a domain is shut off (`virDomainShutoffReason`)."""
    import libvirt

    try:
        state, reason = domain.state()
    except libvirt.libvirtError as error:
        return f"its state cannot be read: {error.get_error_message()}"
    if state != libvirt.VIR_DOMAIN_SHUTOFF:
        return f"libvirt state {state}"
    return _STOP_REASONS.get(reason, f"shut off, reason {reason}")


def _connection_lost(error: BaseException) -> bool:
    """An error of libvirt's connection (libvirtd restarted or stopped), not of the domain being made."""
    import libvirt

    if not isinstance(error, libvirt.libvirtError):
        return False
    return error.get_error_domain() == libvirt.VIR_FROM_RPC or error.get_error_code() in (
        libvirt.VIR_ERR_SYSTEM_ERROR,
        libvirt.VIR_ERR_NO_CONNECT,
        libvirt.VIR_ERR_INVALID_CONN,
        libvirt.VIR_ERR_RPC,
    )


def _undefine(domain: Any) -> None:
    """Undefine with the UEFI NVRAM, managed save and snapshot metadata (QEMU refuses a plain undefine of a domain
    with NVRAM). A driver that does not know those flags (libvirt's test driver) has none of them: undefine plainly."""
    import libvirt

    flags = (
        libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
        | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
        | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    )
    try:
        try:
            domain.undefineFlags(flags)
        except libvirt.libvirtError as error:
            if error.get_error_code() not in (libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT):
                raise
            domain.undefine()
    except libvirt.libvirtError as error:
        if error.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
            raise


def _with_metadata(xml: str, record: VmRecord) -> str:
    """Berth's record of the allocation inside the domain: what `get` and `list` read back after a restart."""
    ET.register_namespace("berth", METADATA_NS)
    root = ET.fromstring(xml)
    metadata = root.find("metadata")
    if metadata is None:
        metadata = ET.Element("metadata")
        root.insert(3, metadata)
    ET.SubElement(metadata, f"{{{METADATA_NS}}}allocation").text = record.model_dump_json()
    ET.indent(root)
    return ET.tostring(root, encoding="unicode")


def _record_of(xml: str) -> VmRecord | None:
    element = ET.fromstring(xml).find(f"metadata/{{{METADATA_NS}}}allocation")
    if element is None or not element.text:
        return None  # not one of Berth's domains
    return VmRecord.model_validate(json.loads(element.text))


def read_console_tail(path: Path, lines: int = 20) -> list[str]:
    """The last non-empty lines of a console log, without terminal escapes; empty when there is no log."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    cleaned = (_ESCAPES.sub("", line).strip() for line in text.splitlines())
    return [line for line in cleaned if line][-lines:]


def _first(values: list[str]) -> str | None:
    return values[0] if values else None


def _quietly(undo: Callable[[], None]) -> None:
    try:
        undo()
    except Exception:  # noqa: BLE001 - best effort while undoing a failed create; the original error is raised
        pass
