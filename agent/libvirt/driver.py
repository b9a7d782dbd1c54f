"""The libvirt `VmDriver`: one domain per allocation, carrying out the node scheduler's plan as it is.

    create:  resolve the image (catalogue) -> copy-on-write overlay in the storage pool -> NoCloud seed ISO ->
             define the domain (plan's GPUs and VFs as managed hostdevs, raw NVMe as block disks, MAC, vCPUs and
             memory, NUMA pinning, guest agent) -> start it. Any failure undoes what was made: never a half-made VM.
    get/list: the domains carrying Berth's metadata (the allocation, its slots and addresses) survive agent restarts;
              a domain named `berth-<allocation>` without it is listed too (the reconciler judges it).
    readiness: the named gates of `readiness.py`.
    destroy: destroy, undefine, delete the overlay and the seed; idempotent.
    wipe:    each released slot's NVMe erased and GPU reset (`host/wipe.py`).

Domain name and UUID derive from the allocation id, so a second `create` finds the first domain instead of making
another. libvirt-python is synchronous: the agent calls it from its activity threads.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, model_validator

from agent.drivers import ImageNotFound, VmCreateError, VmRecord
from agent.host.wipe import HostRunner, SlotWipe, SubprocessRunner, wipe_slot
from agent.libvirt.domain import DomainConfig, domain_name, domain_xml
from agent.libvirt.guest import GuestAgent, LibvirtGuestAgent
from agent.libvirt.guest_health import GuestHealthWatch
from agent.libvirt.readiness import Gates, GateState
from agent.libvirt.seed import GuestInterface, SeedConfig, write_seed_iso
from contracts.allocation import Readiness, VmSpec
from fleet.node import Slot
from scheduler.host.health import DriverSignals

METADATA_NS = "https://berth.dev/xmlns/allocation/1"
DOMAIN_PREFIX = "berth-"  # domain_name()'s default
GIB = 1024**3


class ImageCatalogue(BaseModel):
    """The operator's image catalogue file (YAML): `images: {name: /path/to/base.qcow2}` and an optional `default`."""

    model_config = {"extra": "forbid", "frozen": True}

    images: dict[str, str] = Field(default_factory=dict)
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
    images: dict[str, str] = Field(
        default_factory=dict, description="The image catalogue: image name -> path of its base image (qcow2)."
    )
    default_image: str | None = Field(default=None, description="The image of a request that names none.")
    network: str | None = Field(default="default", description="The libvirt network the VM's interface joins.")
    bridge: str | None = Field(default=None, description="A host bridge instead of a libvirt network.")
    seed_dir: Path = Field(description="Where cloud-init seed ISOs are written (readable by QEMU).")
    disk_gib: int = Field(default=100, ge=1, description="Size of the VM's boot disk (the overlay).")
    ssh_port: int = Field(default=22, ge=1, le=65535, description="The port the `ssh` readiness gate connects to.")

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
    ) -> None:
        import libvirt

        self.settings = settings
        libvirt.registerErrorHandler(lambda _context, _error: None, None)  # errors are raised; libvirt need not print
        self.connection = connection or libvirt.open(settings.uri)
        guest = guest_agent or LibvirtGuestAgent(self.connection)
        self.gates = Gates(guest, ssh_port=settings.ssh_port)
        self.guest = GuestHealthWatch(guest)
        self._ready: set[str] = set()  # domains whose readiness gates all passed: their guest answers now
        self.clock = clock
        self.runner = runner or SubprocessRunner()
        self.domain_config = DomainConfig(
            network=settings.network,
            bridge=settings.bridge,
            storage_pool_path=self._pool_path(),
            host_cpus_by_numa=host_cpus_by_numa,
        )

    # create ------------------------------------------------------------------------------------------------------

    def create(self, spec: VmSpec) -> VmRecord:
        name = domain_name(spec.allocation_id)
        domain = self._lookup(name)
        if domain is not None:  # made before (a retried activity, an agent restart): make sure it runs
            if not domain.isActive():
                domain.create()
            record = _record_of(domain.XMLDesc(0))
            if record is not None:
                return record
        base = self._image(spec.image)
        self._delete_volume(f"{name}.qcow2")  # an overlay left by a create that died half-way: start clean
        made: list[Callable[[], None]] = []
        try:
            overlay = self._overlay(name, base)
            made.append(lambda: self._delete_volume(f"{name}.qcow2"))
            seed = write_seed_iso(self._seed_config(spec, name), self.settings.seed_dir / f"{name}-seed.iso")
            made.append(lambda: seed.unlink(missing_ok=True))
            record = VmRecord(
                vm_id=name,
                allocation_id=spec.allocation_id,
                slot_indexes=[bundle.slot_index for bundle in spec.bundles],
                private_ips=[bundle.private_ip for bundle in spec.bundles if bundle.private_ip],
                created_at=self.clock(),
            )
            xml = _with_metadata(domain_xml(spec, self.domain_config, boot_disk=overlay, seed_iso=seed), record)
            domain = self.connection.defineXML(xml)
            made.append(lambda: _undefine(domain))
            domain.create()
        except Exception as error:
            for undo in reversed(made):
                _quietly(undo)
            if isinstance(error, VmCreateError):
                raise
            raise VmCreateError(f"libvirt could not create {name}: {error}") from error
        return record

    def _image(self, requested: str | None) -> str:
        image = requested or self.settings.default_image
        if image is None:
            raise ImageNotFound("the request names no image and the node has no default image")
        if image not in self.settings.images:
            known = ", ".join(sorted(self.settings.images)) or "none"
            raise ImageNotFound(f"image {image!r} is not in this node's catalogue (known: {known})")
        return self.settings.images[image]

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
        nic = GuestInterface(
            mac=first.mac_address or "", address=addresses[0] if addresses else None, extra_addresses=addresses[1:]
        )
        return SeedConfig(
            instance_id=spec.allocation_id, hostname=name, ssh_public_keys=list(spec.ssh_public_keys), interfaces=[nic]
        )

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
        record = _record_of(domain.XMLDesc(0))
        if record is not None:
            return record
        name = domain.name()
        allocation = name.removeprefix(DOMAIN_PREFIX)
        if name == allocation or not allocation or domain_name(allocation) != name:
            return None  # not named for an allocation: not Berth's business
        # No metadata: its slots are unknown, and its age too (so the reconciler's grace counts from now).
        return VmRecord(vm_id=name, allocation_id=allocation, slot_indexes=[], created_at=self.clock())

    def readiness(self, allocation_id: str, gpu_count: int) -> Readiness:
        record = self.get(allocation_id)
        if record is None:
            return Readiness(ssh=False, cloud_init=False, nvidia_smi=False, detail="no such VM")
        results = {gate.name: gate for gate in self.gates.probe(record.vm_id, _first(record.private_ips), gpu_count)}
        failed = next((gate for gate in results.values() if gate.state is GateState.FAILED), None)
        if all(gate.state is GateState.PASSED for gate in results.values()):
            self._ready.add(record.vm_id)
        return Readiness(
            ssh=results["ssh"].state is GateState.PASSED,
            cloud_init=results["cloud_init"].state is GateState.PASSED,
            nvidia_smi=results["gpus"].state is GateState.PASSED,
            detail="; ".join(f"{gate.name}: {gate.message}" for gate in results.values()),
            failed_gate=failed.name if failed else None,
            failure=failed.message if failed else None,
        )

    # destroy ------------------------------------------------------------------------------------------------------

    def destroy(self, allocation_id: str) -> bool:
        """Stop and remove the domain (its NVRAM too: UEFI domains have one), then the overlay and the seed. Only a
        domain that is already gone is ignored; any other libvirt error is raised, so the teardown is retried and the
        slots are never wiped or freed under a VM that still holds them."""
        name = domain_name(allocation_id)
        domain = self._lookup(name)
        if domain is not None:
            if domain.isActive():
                domain.destroy()
            _undefine(domain)
        self._delete_volume(f"{name}.qcow2")
        (self.settings.seed_dir / f"{name}-seed.iso").unlink(missing_ok=True)
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
        for record in self.list():
            if not record.slot_indexes:
                continue
            booted = record.vm_id in self._ready or self.clock() - record.created_at >= self.guest.interval
            if not booted:
                continue
            readings = self.guest.look(record.vm_id, len(record.slot_indexes))
            found.update(zip(record.slot_indexes, readings, strict=False))
        return found

    def wipe(self, slots: list[Slot]) -> list[SlotWipe]:
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


def _undefine(domain: Any) -> None:
    import libvirt

    """Undefine with the UEFI NVRAM, managed save and snapshot metadata (QEMU refuses a plain undefine of a domain
    with NVRAM). A driver that does not know those flags (libvirt's test driver) has none of them: undefine plainly."""
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


def _first(values: list[str]) -> str | None:
    return values[0] if values else None


def _quietly(undo: Callable[[], None]) -> None:
    try:
        undo()
    except Exception:  # noqa: BLE001 - best effort while undoing a failed create; the original error is raised
        pass
