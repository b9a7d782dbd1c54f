"""The libvirt runtime on libvirt's QEMU driver, booting real guests: Berth's domain XML, its NoCloud seed read by
real cloud-init, the readiness gates passing for real (SSH on the address of libvirt's DHCP lease, `cloud-init status`
through the guest agent), the console kept, a killed QEMU seen as a dead VM, and teardown leaving nothing.

Two guests boot side by side on one host; each check below is on what a tenant or an operator would see."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from agent.libvirt.driver import CatalogueImage, LibvirtSettings, LibvirtVmDriver
from contracts.allocation import Readiness, VmSpec
from contracts.placement import Bundle
from scheduler.host.health import HealthState, SlotSignals, assess
from tests.real_vm.conftest import URI, ssh

pytestmark = [pytest.mark.real_vm, pytest.mark.xdist_group("real_vm")]

BOOT_SECONDS = 300  # a TCG boot to cloud-init's end takes about a minute here; two at once on two cores, more


def make_driver(guest_image, vm_network, vm_pool, **overrides) -> LibvirtVmDriver:
    pool_name, folder = vm_pool
    settings = LibvirtSettings(
        uri=URI,
        storage_pool=pool_name,
        images={"debian": CatalogueImage(**guest_image.catalogue_entry())},
        default_image="debian",
        network=vm_network.name,
        seed_dir=folder,
        disk_gib=4,
        accelerator="tcg",
        passthrough=False,
        firmware="bios",
        guest_addressing="dhcp",
        **overrides,
    )
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


def wait_settled(driver: LibvirtVmDriver, allocation: str, timeout: float = BOOT_SECONDS) -> Readiness:
    """Probe as the node agent does until every gate passes or one fails for good."""
    deadline = time.monotonic() + timeout
    while True:
        report = driver.readiness(allocation, gpu_count=1)
        if report.ready or report.failed_gate is not None:
            return report
        assert time.monotonic() < deadline, f"{allocation} not settled after {timeout}s: {report.detail}"
        time.sleep(2)


def qemu_pid(name: str) -> int:
    return int(Path(f"/run/libvirt/qemu/{name}.pid").read_text())


def test_two_guests_boot_side_by_side_then_a_killed_one_is_a_dead_vm_and_teardown_leaves_nothing(
    real_libvirt, guest_image, vm_network, vm_pool, ssh_key
) -> None:
    key, public_key = ssh_key
    driver = make_driver(guest_image, vm_network, vm_pool)
    assert driver.runtime() == (
        "libvirt qemu:///system: TCG (software emulation, no KVM): configured (accelerator: tcg); "
        "GPUs bookkeeping only (no passthrough)"
    )
    good = vm_spec(
        "rv-good",
        "52:54:00:be:00:01",
        public_key,
        "#cloud-config\nruncmd:\n  - [sh, -c, 'echo made by user-data > /var/tmp/berth-user-data']\n",
    )
    failing = vm_spec(
        "rv-bad", "52:54:00:be:00:02", public_key, "#cloud-config\nruncmd:\n  - [sh, -c, 'exit 7']\n", slot=1
    )
    made = {}
    creators = [
        threading.Thread(target=lambda s=s: made.update({s.allocation_id: driver.create(s)})) for s in (good, failing)
    ]
    for thread in creators:
        thread.start()
    for thread in creators:
        thread.join()
    assert sorted(made) == ["rv-bad", "rv-good"]
    assert sorted(d.name() for d in real_libvirt.listAllDomains(libvirt_active())) >= ["berth-rv-bad", "berth-rv-good"]

    settled: dict[str, Readiness] = {}
    probes = [
        threading.Thread(target=lambda a=a: settled.update({a: wait_settled(driver, a)})) for a in ("rv-good", "rv-bad")
    ]
    for thread in probes:
        thread.start()
    for thread in probes:
        thread.join()

    ready = settled["rv-good"]
    assert ready.ready, ready.detail
    assert ready.address is not None and ready.address.startswith(str(vm_network.subnet.network_address)[:-1])
    assert "gpus: skipped: this host passes no GPU through (bookkeeping only)" in ready.detail
    # The tenant's key logs in as the image's default user; the seed named the guest and ran the tenant's user-data.
    inside = ssh(key, ready.address, "hostname; cat /var/tmp/berth-user-data; cloud-init status")
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.split("\n")[:3] == ["berth-rv-good", "made by user-data", "status: done"]
    assert ssh(key, ready.address, "true", user="root").returncode != 0  # no root logins

    failed = settled["rv-bad"]
    assert failed.failed_gate == "cloud_init"
    assert failed.failure is not None and failed.failure.startswith("status: error")
    assert "scripts_user" in failed.failure or "scripts-user" in failed.failure  # cloud-init's own words
    assert failed.console, "a failed boot carries its console's last lines"

    # QEMU killed from outside: the agent sees a dead VM at its next look, not at the release.
    os.kill(qemu_pid("berth-rv-good"), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while real_libvirt.lookupByName("berth-rv-good").isActive():
        assert time.monotonic() < deadline, "libvirt never noticed its QEMU had gone"
        time.sleep(0.5)
    signals = driver.guest_signals()
    assert signals[0].vm_stopped is not None and "berth-rv-good is not running" in signals[0].vm_stopped
    verdict = assess(SlotSignals(index=0, guest=signals[0]))
    assert verdict.state is HealthState.FAILED
    assert verdict.reasons[0].startswith("the VM holding the GPU stopped: the VM berth-rv-good is not running (")
    after = driver.readiness("rv-good", gpu_count=1)
    assert after.failed_gate == "vm" and after.failure is not None and "stopped" in after.failure

    # Teardown: domains undefined, overlays, seeds and console logs gone.
    _, folder = vm_pool
    for allocation in ("rv-good", "rv-bad"):
        assert driver.destroy(allocation) is True
        assert driver.destroy(allocation) is False  # idempotent
    names = [d.name() for d in real_libvirt.listAllDomains(0)]
    assert "berth-rv-good" not in names and "berth-rv-bad" not in names
    assert sorted(p.name for p in folder.iterdir() if "rv-" in p.name) == []


def libvirt_active() -> int:
    import libvirt

    return libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
