"""What the `real_vm` tests share: libvirt's QEMU driver on this machine, one guest image, and a network and a
storage pool of their own.

- The image is Berth's test guest (devstack/guest_image.py), built once per machine into its cache.
- The network is isolated (no forwarding): a bridge and dnsmasq that only this session's guests and this host sit
  on, on a /24 no other interface or route of the host uses. Nothing a guest sends leaves the bridge.
- The pool is a folder under /var/lib/libvirt/images, which QEMU's user can reach (a pytest temporary folder, under
  a 0700 parent, is not).
- Guests boot under TCG: this machine kind has /dev/kvm, but nested KVM hangs guests right after the kernel's
  real-mode setup (shared/REAL_VMS.md), so the tests ask for TCG rather than let `auto` pick KVM.

On a machine that cannot run libvirt's QEMU driver (no QEMU, no libvirtd, not root) every test here is skipped in one
loud line that names what is missing. Session teardown removes every domain, volume, network and folder made here.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.libvirt.driver import LibvirtVmDriver
from contracts.allocation import VmSpec
from contracts.placement import Bundle
from devstack.guest_image import GuestImage, ImageBuildError, ensure_image
from devstack.real_vms import cannot_run, guest_host_settings, remove_domains_on

URI = "qemu:///system"
IMAGES_ROOT = Path("/var/lib/libvirt/images")


class Reconnecting:
    """A libvirt connection that reopens itself when libvirtd restarted under it (one test restarts it)."""

    def __init__(self) -> None:
        import libvirt

        self._connection = libvirt.open(URI)

    def __getattr__(self, name: str) -> object:
        import libvirt

        try:
            alive = bool(self._connection.isAlive()) and self._connection.getLibVersion() > 0
        except libvirt.libvirtError:
            alive = False
        if not alive:
            self._connection = libvirt.open(URI)
        return getattr(self._connection, name)


@pytest.fixture(scope="session")
def real_libvirt() -> Iterator[object]:
    missing = cannot_run()
    if missing is not None:
        pytest.skip(f"LOUD: real VMs cannot boot on this machine: {missing}: the real_vm tests did NOT run")
    connection = Reconnecting()
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def guest_image(real_libvirt: object) -> GuestImage:
    """Built once per machine; xdist workers wait on one lock rather than build it twice."""
    lock_path = Path("/var/lock/berth-guest-image.lock")
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return ensure_image()
        except ImageBuildError as error:
            pytest.fail(f"the guest image could not be built: {error}", pytrace=False)


@dataclass(frozen=True)
class VmNetwork:
    name: str
    bridge: str
    subnet: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def address(self, host: int) -> str:
        return str(self.subnet.network_address + host)


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no address or route of this host overlaps."""
    text = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    text += subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    used = []
    for word in text.split():
        try:
            used.append(ipaddress.IPv4Network(word, strict=False))
        except ValueError:
            continue
    start = os.getpid() % 200
    for offset in range(200):
        candidate = ipaddress.IPv4Network(f"10.213.{(start + offset) % 200 + 20}.0/24")
        if not any(candidate.overlaps(network) for network in used if network.prefixlen > 0):
            return candidate
    raise RuntimeError("no free /24 in 10.213.0.0/16 for the test network")


def network_xml(network: VmNetwork, *, dhcp: bool = True, reservations: dict[str, str] | None = None) -> str:
    """An isolated libvirt network (no <forward>): guests reach this host and each other, nothing else."""
    hosts = "".join(f"<host mac='{mac}' ip='{ip}'/>" for mac, ip in (reservations or {}).items())
    dhcp_xml = (
        f"<dhcp><range start='{network.address(100)}' end='{network.address(199)}'/>{hosts}</dhcp>" if dhcp else ""
    )
    return (
        f"<network><name>{network.name}</name><bridge name='{network.bridge}' stp='off'/>"
        f"<ip address='{network.gateway}' prefix='24'>{dhcp_xml}</ip></network>"
    )


@pytest.fixture(scope="session")
def vm_network(real_libvirt) -> Iterator[VmNetwork]:
    suffix = uuid.uuid4().hex[:6]
    network = VmNetwork(name=f"berth-test-{suffix}", bridge=f"brt-{suffix}", subnet=free_subnet())
    real_libvirt.networkCreateXML(network_xml(network))
    yield network
    real_libvirt.networkLookupByName(network.name).destroy()


@pytest.fixture(scope="session")
def vm_pool(real_libvirt) -> Iterator[tuple[str, Path]]:
    """A transient directory pool for the overlays, the seeds and the console logs of this session's guests."""
    suffix = uuid.uuid4().hex[:6]
    folder = IMAGES_ROOT / f"berth-test-{suffix}"
    folder.mkdir(parents=True, mode=0o711)
    name = f"berth-test-{suffix}"
    real_libvirt.storagePoolCreateXML(
        f"<pool type='dir'><name>{name}</name><target><path>{folder}</path></target></pool>", 0
    )
    yield name, folder
    remove_domains_on(real_libvirt, folder)  # any guest a failed test left on this session's disks
    real_libvirt.storagePoolLookupByName(name).destroy()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tenant's key pair: the private key's path and the public key's line."""
    folder = tmp_path_factory.mktemp("ssh")
    key = folder / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tenant@berth-test", "-f", str(key)], check=True
    )
    return key, key.with_suffix(".pub").read_text().strip()


def make_driver(guest_image, vm_network, vm_pool, **overrides) -> LibvirtVmDriver:
    pool_name, folder = vm_pool
    settings = guest_host_settings(guest_image, vm_network.name, pool_name, folder, accelerator="tcg")
    settings = settings.model_copy(update=overrides)
    return LibvirtVmDriver(settings, {0: sorted(os.sched_getaffinity(0))})  # this machine's CPUs, as NUMA node 0


def vm_spec(allocation: str, mac: str, public_key: str, user_data: str | None = None, slot: int = 0) -> VmSpec:
    bundle = Bundle(
        slot_id=f"vmhost/{slot}",
        slot_index=slot,
        gpu_pci=f"0000:{0x10 + slot:02x}:00.0",  # bookkeeping only on this host: nothing is attached
        fabric_parent_pci=None,
        fabric_vf_pci=None,
        nvme_device=None,
        numa_node=0,
        vcpu_count=1,
        memory_mib=640,
        mac_address=mac,
        private_ip=None,
    )
    return VmSpec(
        allocation_id=allocation, node="vmhost", bundles=[bundle], ssh_public_keys=[public_key], user_data=user_data
    )


def ssh(key: Path, address: str, command: str, user: str = "debian") -> subprocess.CompletedProcess[str]:
    """Run one command in a guest as its default user, with the tenant's key and nothing else."""
    return subprocess.run(
        [
            "ssh",
            "-i",
            str(key),
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
            f"{user}@{address}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
