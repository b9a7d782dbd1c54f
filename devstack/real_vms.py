"""`berth up --real-vms`: the fleet's hosts run real VMs on this machine's libvirt (QEMU), not simulated ones.

    check libvirt and the image's tools -> the guest image (devstack/guest_image.py, built once per machine)
    -> a storage pool (a folder under /var/lib/libvirt/images) -> the stack's own network, made from the fleet's
       slots: an isolated bridge on their /24, DHCP reserving each slot's address for its MAC
    -> the agent's libvirt settings (a YAML file `berth worker node --libvirt-config` reads)
    ... the stack runs ...
    stop: every VM on the stack's pool destroyed and undefined, the pool and the network removed

The hosts' topology stays the fleet entry's (this machine has no GPUs): their GPUs are bookkeeping only, nothing is
passed through and the `gpus` gate is skipped, saying so. Everything else is what a real host does.

TCG or KVM: `accelerator` (default `auto`: KVM where /dev/kvm opens and libvirt offers it). A VM whose host has
/dev/kvm but cannot run nested guests hangs under KVM: give `BERTH_REAL_VMS_ACCELERATOR=tcg` there.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from devstack.guest_image import GuestImage, ImageBuildError, ensure_image, missing_tools
from fleet.loader import load_fleet
from fleet.node import Node

if TYPE_CHECKING:
    from agent.libvirt.driver import LibvirtSettings

URI = "qemu:///system"
IMAGES_ROOT = Path("/var/lib/libvirt/images")


class RealVmsUnavailable(RuntimeError):
    """This machine cannot run the real-VM host; the message says what is missing and how to get it."""


@dataclass
class RealVmHost:
    """What the stack made in libvirt for its real-VM hosts, and how to remove it."""

    network: str
    pool: str
    folder: Path
    config_file: Path
    image: GuestImage

    def teardown(self, say: Callable[[str], None]) -> None:
        """Destroy every VM on the stack's pool, then the pool and the network: nothing of the stack outlives it."""
        import libvirt

        try:
            connection = libvirt.open(URI)
        except libvirt.libvirtError as error:
            say(f"real VMs: libvirt is not answering ({error.get_error_message()}); VMs of this stack may remain")
            return
        try:
            gone = remove_domains_on(connection, self.folder)
            _destroy(connection.storagePoolLookupByName, self.pool)
            _destroy(connection.networkLookupByName, self.network)
        finally:
            connection.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        say(f"real VMs: {gone} VM(s) of this stack destroyed, network {self.network} and pool {self.pool} removed")


def prepare(fleet_file: Path, state: Path, say: Callable[[str], None], accelerator: str | None = None) -> RealVmHost:
    """Everything libvirt needs before the real-VM hosts' agents start. Raises RealVmsUnavailable with the reason."""
    connection = _connect()
    nodes = [node for pool in load_fleet([fleet_file]).host_pools() for node in pool.nodes]
    if not nodes:
        raise RealVmsUnavailable(f"{fleet_file} has no hosts to run real VMs on")
    say("real VMs: the guest image (built once per machine from Debian's packages, about a minute) ...")
    try:
        image = ensure_image()
    except ImageBuildError as error:
        raise RealVmsUnavailable(str(error)) from error
    tag = hashlib.sha256(str(state).encode()).hexdigest()[:6]
    name, folder = f"berth-up-{tag}", IMAGES_ROOT / f"berth-up-{tag}"
    try:
        _destroy(connection.storagePoolLookupByName, name)  # a stack killed before its teardown left these
        _destroy(connection.networkLookupByName, name)
        remove_domains_on(connection, folder)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, mode=0o711)
        connection.storagePoolCreateXML(
            f"<pool type='dir'><name>{name}</name><target><path>{folder}</path></target></pool>", 0
        )
        connection.networkCreateXML(network_xml(name, f"brb-{tag}", nodes))
    except Exception as error:
        raise RealVmsUnavailable(f"libvirt refused the stack's network or pool: {error}") from error
    finally:
        connection.close()
    chosen = accelerator or os.environ.get("BERTH_REAL_VMS_ACCELERATOR", "auto")
    settings = guest_host_settings(image, name, name, folder, chosen)
    config_file = state / "real-vms" / "libvirt.yaml"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False))
    say(f"real VMs: network {name} ({_subnet(nodes)}), pool {folder}, image {image.disk}")
    return RealVmHost(network=name, pool=name, folder=folder, config_file=config_file, image=image)


def cannot_run() -> str | None:
    """What this machine lacks to boot real guests, in a few words; None when nothing. The dev stack, the real_vm
    tests and the benchmark ask the same question."""
    if os.geteuid() != 0:
        return "not root (libvirt's QEMU driver at qemu:///system and its bridge need root)"
    lacking = [tool for tool in ("qemu-system-x86_64", "virsh", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    lacking += missing_tools()
    if lacking:
        return f"{', '.join(lacking)} not installed (scripts/test-prerequisites.sh installs them)"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (a guest's NIC needs a tap device)"
    try:
        import libvirt
    except ImportError:
        return "libvirt-python is not installed: pip install -e '.[host]'"
    libvirt.registerErrorHandler(lambda _context, _error: None, None)
    try:
        libvirt.open(URI).close()
    except libvirt.libvirtError as error:
        return (
            f"libvirtd does not answer at {URI} ({error.get_error_message()}): scripts/test-prerequisites.sh starts "
            "it (with virtlogd)"
        )
    problem = virtlogd_problem()
    if problem is not None:
        return problem
    return None


def virtlogd_problem(socket_path: str = "/run/libvirt/virtlogd-sock") -> str | None:
    """Whether virtlogd answers, which libvirtd only finds out when a guest starts (every start then fails). Its
    socket file alone proves nothing: /run can outlive the daemon, as on a machine restored from a snapshot."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(socket_path)
        except OSError as error:
            return (
                f"virtlogd does not answer at {socket_path} ({error.strerror}): every guest start would fail; "
                "scripts/test-prerequisites.sh starts it"
            )
    return None


def guest_host_settings(
    image: GuestImage, network: str, pool: str, folder: Path, accelerator: str = "auto"
) -> LibvirtSettings:
    """A libvirt runtime for a host without GPUs that boots Berth's test image: GPUs bookkeeping only, the image
    booted directly under BIOS, the address from the network's DHCP."""
    from agent.libvirt.driver import CatalogueImage, LibvirtSettings

    return LibvirtSettings(
        uri=URI,
        storage_pool=pool,
        images={"debian": CatalogueImage(**image.catalogue_entry())},
        default_image="debian",
        network=network,
        seed_dir=folder,
        disk_gib=4,
        accelerator=accelerator,
        passthrough=False,
        firmware="bios",
        guest_addressing="dhcp",
    )


def network_xml(name: str, bridge: str, nodes: list[Node]) -> str:
    """An isolated network (no forwarding) on the /24 of the fleet's slot addresses, the host at .1, each slot's
    address reserved for its MAC: the guest's DHCP lease is the address the plan (and `berth alloc get`) shows."""
    subnet = _subnet(nodes)
    hosts = "".join(
        f"<host mac='{slot.mac}' ip='{slot.private_ip}'/>"
        for node in nodes
        for slot in node.slots
        if slot.mac and slot.private_ip
    )
    return (
        f"<network><name>{name}</name><bridge name='{bridge}' stp='off'/>"
        f"<ip address='{subnet.network_address + 1}' prefix='{subnet.prefixlen}'><dhcp>"
        f"<range start='{subnet.network_address + 200}' end='{subnet.network_address + 250}'/>{hosts}"
        "</dhcp></ip></network>"
    )


def _subnet(nodes: list[Node]) -> ipaddress.IPv4Network:
    addresses = [slot.private_ip for node in nodes for slot in node.slots if slot.private_ip is not None]
    if not addresses or any(slot.mac is None for node in nodes for slot in node.slots):
        raise RealVmsUnavailable("every slot of a real-VM host needs a `mac` and a `privateIp` (its DHCP reservation)")
    subnets = {ipaddress.IPv4Network(f"{address}/24", strict=False) for address in addresses}
    if len(subnets) != 1:
        raise RealVmsUnavailable(
            f"the real-VM hosts' slot addresses must share one /24, not {sorted(map(str, subnets))}"
        )
    (subnet,) = subnets
    return subnet


def _connect() -> Any:
    missing = cannot_run()
    if missing is not None:
        raise RealVmsUnavailable(f"--real-vms cannot run here: {missing}")
    import libvirt

    return libvirt.open(URI)


def domains_on(connection: Any, folder: Path) -> list[str]:
    """The names of the domains whose disks are in `folder`: the VMs of one stack (or one test session)."""
    import libvirt

    names = []
    for domain in connection.listAllDomains(0):
        try:
            if str(folder) in domain.XMLDesc(0):
                names.append(domain.name())
        except libvirt.libvirtError:
            continue  # undefined since it was listed
    return sorted(names)


def remove_domains_on(connection: Any, folder: Path) -> int:
    """Destroy and undefine every domain whose disks are in `folder`; how many there were."""
    import libvirt

    removed = 0
    for name in domains_on(connection, folder):
        try:
            domain = connection.lookupByName(name)
            if domain.isActive():
                domain.destroy()
            domain.undefine()
            removed += 1
        except libvirt.libvirtError as error:
            if error.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
    return removed


def _destroy(lookup: Callable[[str], Any], name: str) -> None:
    """Remove a transient pool or network by name if it is there."""
    import libvirt

    try:
        lookup(name).destroy()
    except libvirt.libvirtError:
        pass
