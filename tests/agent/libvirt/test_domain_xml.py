"""The libvirt domain XML of one allocation, built from the example 2-GPU plan of docs/seeds.md, "The GPU slice
bundle": what the VM gets (CPUs pinned to the plan's NUMA node, its memory bound there, both bundles' GPUs, VFs and
NVMe disks at fixed guest addresses, the first slot's MAC), that the same allocation always gives the same bytes,
and that what libvirt hands back still reads the same. Pure: no libvirt here, except `virt-xml-validate` when it is
installed."""

from __future__ import annotations

import subprocess
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.libvirt.domain import (
    SEED_SERIAL,
    BlockDisk,
    DirectBoot,
    DomainConfig,
    PciHostdev,
    domain_name,
    domain_uuid,
    domain_xml,
    format_cpuset,
    parse_cpuset,
    parse_domain,
)
from contracts.allocation import VmSpec
from contracts.placement import Bundle
from tests.libvirt_required import tools

NUMA_0 = [*range(0, 24), *range(96, 120)]
NUMA_1 = [*range(24, 48), *range(120, 144)]
POOL = Path("/var/lib/berth/pool")
BOOT = POOL / "alloc-7f3a.qcow2"
SEED = POOL / "alloc-7f3a-seed.iso"
NVME_1 = "/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6RENA0W100001"
NVME_2 = "/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6RENA0W100002"
IMAGES = Path("/var/lib/berth/images")
CONSOLE = POOL / "alloc-7f3a-console.log"


def _bundle(slot: int, gpu: str, parent: str, vf: str, nvme: str, *, numa: int = 0, mac: str | None = None) -> Bundle:
    return Bundle(
        slot_id=f"hgx-01/{slot}",
        slot_index=slot,
        gpu_pci=gpu,
        fabric_parent_pci=parent,
        fabric_vf_pci=vf,
        nvme_device=nvme,
        numa_node=numa,
        vcpu_count=24,
        memory_mib=65536,
        mac_address=mac,
        private_ip=f"10.100.0.{10 + slot}",
    )


def _seed_plan(*, second_numa: int = 0, first_mac: str | None = "52:54:00:0a:00:01") -> list[Bundle]:
    """The example 2-GPU plan of docs/seeds.md, "The GPU slice bundle": slots 1 and 2, both on NUMA node 0."""
    return [
        _bundle(1, "0000:3c:00.0", "0000:3a:00.0", "0000:3a:00.2", NVME_1, mac=first_mac),
        _bundle(2, "0000:4b:00.0", "0000:4d:00.0", "0000:4d:00.2", NVME_2, numa=second_numa, mac="52:54:00:0a:00:02"),
    ]


def _spec(bundles: list[Bundle], allocation_id: str = "alloc-7f3a") -> VmSpec:
    return VmSpec(allocation_id=allocation_id, node="hgx-01", bundles=bundles, ssh_public_keys=["ssh-ed25519 AAAA t"])


def _config(**overrides: object) -> DomainConfig:
    values: dict[str, object] = {
        "network": "berth-private",
        "storage_pool_path": POOL,
        "host_cpus_by_numa": {0: NUMA_0, 1: NUMA_1},
    }
    return DomainConfig.model_validate(values | overrides)


def _xml(
    bundles: list[Bundle] | None = None,
    config: DomainConfig | None = None,
    *,
    boot: DirectBoot | None = None,
    console_log: Path | None = None,
) -> str:
    return domain_xml(
        _spec(bundles or _seed_plan()),
        config or _config(),
        boot_disk=BOOT,
        seed_iso=SEED,
        boot=boot,
        console_log=console_log,
    )


DEBIAN_BOOT = DirectBoot(
    kernel=IMAGES / "vmlinuz-6.1.0-28-cloud-amd64",
    initrd=IMAGES / "initrd.img-6.1.0-28-cloud-amd64",
    cmdline="root=/dev/vda console=ttyS0",
)

# Every shape of document Berth writes: the accelerator (KVM, or TCG without a host CPU to pass through), with the
# plan's devices passed through or not, pinned to a NUMA node or not, booted by the firmware (UEFI or BIOS) from the
# disk or directly from a kernel, with the console kept in a file or not, on a network or a bridge.
SHAPES: dict[str, Callable[[], str]] = {
    "kvm-passthrough-pinned": lambda: _xml(config=_config(emulator="/usr/bin/qemu-system-x86_64")),
    "kvm-passthrough-unpinned": lambda: _xml(_seed_plan(second_numa=1)),
    "tcg-no-passthrough": lambda: _xml(config=_config(domain_type="qemu", passthrough=False)),
    "direct-boot-initrd-cmdline": lambda: _xml(boot=DEBIAN_BOOT),
    "direct-boot-kernel-only": lambda: _xml(boot=DirectBoot(kernel=DEBIAN_BOOT.kernel)),
    "console-log": lambda: _xml(console_log=CONSOLE),
    "efi": lambda: _xml(config=_config(firmware="efi")),
    "bios": lambda: _xml(config=_config(firmware="bios")),
    "bridge": lambda: _xml(config=_config(network=None, bridge="br-tenant")),
    # what the real_vm tests boot: TCG, no passthrough, BIOS, Debian's kernel booted directly, the console kept
    "tcg-test-host": lambda: _xml(
        config=_config(domain_type="qemu", passthrough=False, firmware="bios"), boot=DEBIAN_BOOT, console_log=CONSOLE
    ),
}


def test_the_seed_plan_gives_one_vm_with_both_bundles_pinned_to_numa_0() -> None:
    facts = parse_domain(_xml())

    assert facts.name == "berth-alloc-7f3a"
    assert facts.uuid == domain_uuid("alloc-7f3a")
    assert facts.vcpus == 48
    assert facts.cpuset == "0-23,96-119"
    assert facts.memory_mib == 131072
    assert (facts.numa_mode, facts.numa_nodeset) == ("strict", "0")
    assert facts.hostdevs == [
        PciHostdev(source="0000:3c:00.0", guest="0000:01:00.0"),
        PciHostdev(source="0000:3a:00.2", guest="0000:02:00.0"),
        PciHostdev(source="0000:4b:00.0", guest="0000:03:00.0"),
        PciHostdev(source="0000:4d:00.2", guest="0000:04:00.0"),
    ]
    assert facts.block_disks == [
        BlockDisk(source=NVME_1, target="vdb", serial="berth-slot-1"),
        BlockDisk(source=NVME_2, target="vdc", serial="berth-slot-2"),
    ]
    assert (facts.boot_disk, facts.seed_iso) == (str(BOOT), str(SEED))
    assert (facts.mac, facts.network, facts.bridge) == ("52:54:00:0a:00:01", "berth-private", None)
    assert facts.has_guest_agent


def test_the_document_has_what_passthrough_needs_and_nothing_that_fights_it() -> None:
    xml = _xml()

    assert xml.startswith('<domain type="kvm">\n  <name>berth-alloc-7f3a</name>\n')
    assert '<vcpu placement="static" cpuset="0-23,96-119">48</vcpu>' in xml
    assert '<memory unit="MiB">131072</memory>' in xml
    assert '<type arch="x86_64" machine="q35">hvm</type>' in xml
    assert '<cpu mode="host-passthrough" />' in xml
    assert '<memballoon model="none" />' in xml
    assert '<driver name="qemu" type="raw" cache="none" io="native" />' in xml
    assert '<source file="/var/lib/berth/pool/alloc-7f3a-seed.iso" />' in xml
    assert '<hostdev mode="subsystem" type="pci" managed="yes">' in xml
    assert '<address domain="0x0000" bus="0x3c" slot="0x00" function="0x0" />' in xml
    # One root port per pinned bus, each pinned itself on pcie.0, so the guest addresses exist and stay put.
    for bus in range(1, 5):
        assert f'<controller type="pci" model="pcie-root-port" index="{bus}">' in xml
    assert '<address type="pci" domain="0x0000" bus="0x00" slot="0x01" function="0x0" multifunction="on" />' in xml
    assert '<address type="pci" domain="0x0000" bus="0x00" slot="0x01" function="0x3" />' in xml


def test_a_plan_across_two_numa_nodes_is_not_pinned() -> None:
    xml = _xml(_seed_plan(second_numa=1))
    facts = parse_domain(xml)

    assert (facts.vcpus, facts.memory_mib) == (48, 131072)
    assert facts.cpuset is None
    assert facts.numa_nodeset is None
    assert "numatune" not in xml
    assert len(facts.hostdevs) == 4


def test_a_bridge_instead_of_a_network() -> None:
    facts = parse_domain(_xml(config=_config(network=None, bridge="br-tenant")))

    assert (facts.network, facts.bridge, facts.mac) == (None, "br-tenant", "52:54:00:0a:00:01")


def test_the_same_allocation_gives_the_same_name_uuid_and_bytes() -> None:
    first = _xml()
    second = domain_xml(
        _spec(_seed_plan()),
        _config(host_cpus_by_numa={1: NUMA_1, 0: list(reversed(NUMA_0))}),
        boot_disk=BOOT,
        seed_iso=SEED,
    )

    assert first == second
    assert (
        domain_uuid("alloc-7f3a")
        == domain_uuid("alloc-7f3a")
        == uuid.uuid5(uuid.UUID("897023a2-de2f-4924-a025-15badc478f46"), "alloc-7f3a")
    )
    assert domain_uuid("alloc-7f3a") != domain_uuid("alloc-7f3b")
    other = parse_domain(domain_xml(_spec(_seed_plan(), "alloc-7f3b"), _config(), boot_disk=BOOT, seed_iso=SEED))
    assert (other.name, other.uuid) == ("berth-alloc-7f3b", domain_uuid("alloc-7f3b"))


def test_domain_names_are_libvirt_safe_bounded_and_distinct() -> None:
    assert domain_name("a1b2c3d4e5f60718") == "berth-a1b2c3d4e5f60718"
    assert domain_name("x", prefix="lab-") == "lab-x"

    odd = domain_name("tenant/a b:c")
    assert odd.startswith("berth-tenant-a-b-c-") and len(odd) == len("berth-tenant-a-b-c-") + 8
    assert domain_name("tenant/a b:c") != domain_name("tenant-a-b-c") == "berth-tenant-a-b-c"

    long_a, long_b = domain_name("a" * 100), domain_name("a" * 101)
    assert len(long_a) == len(long_b) == 64 and long_a != long_b
    for name in (odd, long_a):
        assert all(c.isascii() and (c.isalnum() or c in "_.+-") for c in name)


def test_parse_domain_reads_what_libvirt_returns() -> None:
    """libvirt rewrites memory in KiB, adds aliases, controllers, driver elements and its own addresses, and may
    write PCI numbers without zero padding: none of that changes the facts."""
    returned = f"""<domain type='kvm' id='7'>
  <name>berth-alloc-7f3a</name>
  <uuid>{domain_uuid("alloc-7f3a")}</uuid>
  <metadata><libosinfo:libosinfo xmlns:libosinfo="http://libosinfo.org/xmlns/libvirt/domain/1.0"/></metadata>
  <memory unit='KiB'>134217728</memory>
  <currentMemory unit='KiB'>134217728</currentMemory>
  <vcpu placement='static' cpuset='0-23,96-119,^200'>48</vcpu>
  <numatune><memory mode='strict' nodeset='0'/></numatune>
  <resource><partition>/machine</partition></resource>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type><boot dev='hd'/></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{BOOT}' index='3'/>
      <backingStore type='file' index='4'><format type='qcow2'/><source file='/var/lib/berth/images/base.qcow2'/></backingStore>
      <target dev='vda' bus='virtio'/>
      <alias name='virtio-disk0'/>
      <address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/><source file='{SEED}' index='2'/><target dev='sda' bus='sata'/><readonly/>
      <address type='drive' controller='0' bus='0' target='0' unit='0'/>
    </disk>
    <disk type='block' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native'/>
      <source dev='{NVME_1}' index='1'/>
      <target dev='vdb' bus='virtio'/>
      <serial>berth-slot-1</serial>
      <alias name='virtio-disk1'/>
    </disk>
    <controller type='pci' index='0' model='pcie-root'><alias name='pcie.0'/></controller>
    <controller type='pci' index='1' model='pcie-root-port'>
      <model name='pcie-root-port'/><target chassis='1' port='0x8'/><alias name='pci.1'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x01' function='0x0' multifunction='on'/>
    </controller>
    <interface type='network'>
      <mac address='52:54:00:0A:00:01'/>
      <source network='berth-private' portid='9a0c' bridge='virbr1'/>
      <target dev='vnet3'/><model type='virtio'/><alias name='net0'/>
    </interface>
    <channel type='unix'>
      <source mode='bind' path='/var/lib/libvirt/qemu/channel/target/domain-7/org.qemu.guest_agent.0'/>
      <target type='virtio' name='org.qemu.guest_agent.0' state='disconnected'/>
      <address type='virtio-serial' controller='0' bus='0' port='1'/>
    </channel>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <driver name='vfio'/>
      <source><address domain='0x0000' bus='0x3C' slot='0x0' function='0x0'/></source>
      <alias name='hostdev0'/>
      <address type='pci' domain='0x0000' bus='0x1' slot='0x00' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address bus='58' slot='0' function='2'/></source>
      <address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='usb' managed='yes'><source><vendor id='0x1234'/><product id='0xbeef'/></source></hostdev>
    <memballoon model='none'/>
  </devices>
  <seclabel type='dynamic' model='dac' relabel='yes'/>
</domain>
"""
    facts = parse_domain(returned)

    assert (facts.name, facts.uuid) == ("berth-alloc-7f3a", domain_uuid("alloc-7f3a"))
    assert (facts.memory_mib, facts.vcpus, facts.cpuset, facts.numa_nodeset) == (131072, 48, "0-23,96-119", "0")
    assert facts.hostdevs == [
        PciHostdev(source="0000:3c:00.0", guest="0000:01:00.0"),
        PciHostdev(source="0000:3a:00.2", guest="0000:02:00.0"),
    ]
    assert facts.hostdev_sources == ["0000:3c:00.0", "0000:3a:00.2"]
    assert facts.block_disks == [BlockDisk(source=NVME_1, target="vdb", serial="berth-slot-1")]
    assert (facts.boot_disk, facts.seed_iso) == (str(BOOT), str(SEED))
    assert (facts.mac, facts.network, facts.bridge) == ("52:54:00:0a:00:01", "berth-private", "virbr1")
    assert facts.has_guest_agent


def test_parse_domain_round_trips_what_domain_xml_wrote() -> None:
    xml = _xml()
    assert parse_domain(xml) == parse_domain(xml.replace('"', "'"))
    assert parse_domain(xml).uuid == uuid.UUID(str(domain_uuid("alloc-7f3a")))


def test_cpusets_are_compact_and_read_back() -> None:
    assert format_cpuset(NUMA_0) == "0-23,96-119"
    assert format_cpuset([5, 3, 4, 9]) == "3-5,9"
    assert parse_cpuset("0-3,^2,8") == [0, 1, 3, 8]
    assert parse_cpuset(format_cpuset(NUMA_1)) == NUMA_1


def test_a_spec_with_no_bundles_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one bundle"):
        domain_xml(_spec([]), _config(), boot_disk=BOOT, seed_iso=SEED)


def test_a_plan_without_the_first_slots_mac_is_refused() -> None:
    with pytest.raises(ValueError, match="slot 1 has no MAC address; the plan must carry"):
        _xml(_seed_plan(first_mac=None))


def test_a_malformed_pci_address_is_refused_with_its_slot() -> None:
    bad_gpu = [_seed_plan()[0].model_copy(update={"gpu_pci": "3c:00.0"})]
    with pytest.raises(ValueError, match=r"slot 1: '3c:00.0' is not a PCI address"):
        _xml(bad_gpu)
    bad_vf = [_seed_plan()[0].model_copy(update={"fabric_vf_pci": "0000:3a:20.2"})]
    with pytest.raises(ValueError, match="slot 1: '0000:3a:20.2' is not a PCI address"):
        _xml(bad_vf)


def test_pinning_without_the_nodes_cpus_is_refused() -> None:
    with pytest.raises(ValueError, match="NUMA node 0, but the agent's host_cpus_by_numa has no CPUs"):
        _xml(config=_config(host_cpus_by_numa={1: NUMA_1}))


def test_the_config_wants_exactly_one_attachment_and_a_q35_machine() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        _config(bridge="br0")
    with pytest.raises(ValueError, match="exactly one"):
        _config(network=None)
    with pytest.raises(ValueError, match="not a q35"):
        _config(machine="pc-i440fx-7.2")
    assert _config(machine="pc-q35-7.2").machine == "pc-q35-7.2"


@pytest.mark.parametrize("shape", SHAPES)
def test_libvirts_schema_accepts_the_document(tmp_path: Path, shape: str) -> None:
    tools("virt-xml-validate", "xmllint")
    path = tmp_path / f"{shape}.xml"
    path.write_text(SHAPES[shape]())
    result = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("shape", SHAPES)
def test_libvirts_test_driver_defines_starts_and_returns_the_same_facts(tmp_path: Path, shape: str) -> None:
    """libvirt's own parser is the final word: define and start the domain in the test driver (in process, nothing
    touched on the host), and read back what it returns."""
    tools("virsh")
    xml = SHAPES[shape]()
    path = tmp_path / "domain.xml"
    path.write_text(xml)
    commands = f"define {path}; start berth-alloc-7f3a; dumpxml berth-alloc-7f3a"
    result = subprocess.run(
        ["virsh", "-q", "-c", "test:///default", commands], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr

    returned = result.stdout[result.stdout.index("<domain") :]
    assert parse_domain(returned) == parse_domain(xml)
    written, kept = ET.fromstring(xml), ET.fromstring(returned)
    assert kept.get("type") == written.get("type")
    for path in ("os/kernel", "os/initrd", "os/cmdline", "devices/serial/log"):
        assert (kept.find(path) is None) == (written.find(path) is None), path
        if written.find(path) is not None:
            assert (kept.findtext(path), kept.find(path).attrib) == (written.findtext(path), written.find(path).attrib)


def _disks(xml: str) -> list[tuple[str | None, str | None, str | None, str | None, bool, str | None]]:
    """Each disk as (device, source, target, bus, read-only, serial), in document order."""
    found = []
    for disk in ET.fromstring(xml).iterfind("devices/disk"):
        source, target = disk.find("source"), disk.find("target")
        found.append(
            (
                disk.get("device"),
                None if source is None else source.get("file") or source.get("dev"),
                None if target is None else target.get("dev"),
                None if target is None else target.get("bus"),
                disk.find("readonly") is not None,
                disk.findtext("serial"),
            )
        )
    return found


def test_the_seed_is_a_read_only_virtio_disk_after_the_nvme_disks() -> None:
    """Not a SATA cdrom: Debian's cloud kernel has no AHCI driver. Its serial tells it from the boot disk."""
    xml = _xml()
    assert _disks(xml) == [
        ("disk", str(BOOT), "vda", "virtio", False, None),
        ("disk", NVME_1, "vdb", "virtio", False, "berth-slot-1"),
        ("disk", NVME_2, "vdc", "virtio", False, "berth-slot-2"),
        ("disk", str(SEED), "vdd", "virtio", True, SEED_SERIAL),
    ]
    assert SEED_SERIAL == "berth-seed"
    assert "cdrom" not in xml and "sata" not in xml
    one = _xml(_seed_plan()[:1])
    assert [target for _, _, target, _, _, _ in _disks(one)] == ["vda", "vdb", "vdc"]  # boot, slot 1's NVMe, seed


def test_parse_domain_finds_the_seed_disk_by_its_serial_as_libvirt_returns_it() -> None:
    """Wherever the seed disk sits among the disks, its serial says it is the seed; the boot disk is the other file
    disk (an older domain's seed, a cdrom, is read as well: test_parse_domain_reads_what_libvirt_returns)."""
    returned = f"""<domain type='qemu' id='3'>
  <name>berth-alloc-7f3a</name>
  <uuid>{domain_uuid("alloc-7f3a")}</uuid>
  <memory unit='KiB'>2097152</memory>
  <vcpu placement='static'>2</vcpu>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type><kernel>/k/vmlinuz</kernel></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{SEED}' index='1'/>
      <backingStore/>
      <target dev='vdb' bus='virtio'/>
      <readonly/>
      <serial>berth-seed</serial>
      <alias name='virtio-disk1'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{BOOT}' index='2'/>
      <target dev='vda' bus='virtio'/>
      <alias name='virtio-disk0'/>
    </disk>
    <interface type='network'><mac address='52:54:00:0a:00:01'/><source network='berth-private'/></interface>
  </devices>
</domain>
"""
    facts = parse_domain(returned)
    assert (facts.boot_disk, facts.seed_iso) == (str(BOOT), str(SEED))
    assert (facts.block_disks, facts.hostdevs, facts.has_guest_agent) == ([], [], False)


def test_tcg_without_passthrough_attaches_nothing_of_the_plan() -> None:
    """A host where KVM does not run guests and no GPU passes through: QEMU's own CPU model (TCG cannot pass the
    host's through), no hostdevs, no NVMe, no root ports; the plan's MAC, CPUs and memory still hold."""
    xml = _xml(config=_config(domain_type="qemu", passthrough=False))
    root = ET.fromstring(xml)
    assert root.get("type") == "qemu" and root.find("cpu") is None
    assert root.find("devices/hostdev") is None and root.find("devices/controller") is None
    assert _disks(xml) == [
        ("disk", str(BOOT), "vda", "virtio", False, None),
        ("disk", str(SEED), "vdb", "virtio", True, SEED_SERIAL),
    ]
    facts = parse_domain(xml)
    assert (facts.vcpus, facts.memory_mib, facts.cpuset, facts.mac) == (48, 131072, "0-23,96-119", "52:54:00:0a:00:01")
    assert (facts.hostdevs, facts.block_disks, facts.seed_iso) == ([], [], str(SEED))

    kvm = ET.fromstring(_xml(config=_config(domain_type="kvm", passthrough=False)))
    assert kvm.get("type") == "kvm" and kvm.find("cpu").attrib == {"mode": "host-passthrough"}
    assert kvm.find("devices/hostdev") is None
    with pytest.raises(ValueError, match="domain_type"):
        _config(domain_type="tcg")  # libvirt's word for TCG is `qemu`


def test_direct_kernel_boot_names_the_kernel_initrd_and_command_line_instead_of_a_boot_device() -> None:
    os_ = ET.fromstring(_xml(boot=DEBIAN_BOOT)).find("os")
    assert os_ is not None and [child.tag for child in os_] == ["type", "kernel", "initrd", "cmdline"]
    assert (os_.findtext("kernel"), os_.findtext("initrd"), os_.findtext("cmdline")) == (
        str(DEBIAN_BOOT.kernel),
        str(DEBIAN_BOOT.initrd),
        "root=/dev/vda console=ttyS0",
    )
    kernel_only = ET.fromstring(_xml(boot=DirectBoot(kernel=DEBIAN_BOOT.kernel))).find("os")
    assert kernel_only is not None and [child.tag for child in kernel_only] == ["type", "kernel"]
    from_disk = ET.fromstring(_xml()).find("os")
    assert from_disk is not None and [(c.tag, c.attrib) for c in from_disk][1:] == [("boot", {"dev": "hd"})]

    with pytest.raises(ValueError, match="the kernel path 'vmlinuz' must be absolute"):
        _xml(boot=DirectBoot(kernel=Path("vmlinuz")))
    with pytest.raises(ValueError, match="the initrd path 'initrd.img' must be absolute"):
        _xml(boot=DirectBoot(kernel=DEBIAN_BOOT.kernel, initrd=Path("initrd.img")))


def test_the_console_is_kept_in_its_log_file_when_one_is_given() -> None:
    serial = ET.fromstring(_xml(console_log=CONSOLE)).find("devices/serial")
    assert serial is not None and serial.attrib == {"type": "pty"}
    assert [(child.tag, child.attrib) for child in serial] == [("log", {"file": str(CONSOLE), "append": "off"})]
    plain = ET.fromstring(_xml()).find("devices/serial")
    assert plain is not None and list(plain) == []
    with pytest.raises(ValueError, match="the console log path 'console.log' must be absolute"):
        _xml(console_log=Path("console.log"))


def test_uefi_by_default_and_bios_when_configured() -> None:
    assert _config().firmware == "efi"
    assert ET.fromstring(_xml()).find("os").attrib == {"firmware": "efi"}
    assert ET.fromstring(_xml(config=_config(firmware="bios"))).find("os").attrib == {}
    with pytest.raises(ValueError, match="firmware"):
        _config(firmware="coreboot")
