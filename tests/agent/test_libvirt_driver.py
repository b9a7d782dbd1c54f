"""The libvirt VM runtime against real libvirt, through its own test driver (`test:///<host.xml>`: the real library
and API, with a custom host). The guest agent is the one thing the test driver lacks; `RecordedGuestAgent` answers
as QEMU documents. The SSH gate connects to a real listener on loopback."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator
from pathlib import Path

import pycdlib
import pytest
import yaml

from agent.drivers import VmCreateError
from agent.libvirt.guest import Recorded, RecordedGuestAgent
from contracts.allocation import VmSpec
from tests.libvirt_required import libvirt_module

libvirt = libvirt_module()

from agent.libvirt.domain import domain_name, parse_domain  # noqa: E402
from agent.libvirt.driver import ImageNotFound, LibvirtSettings, LibvirtVmDriver  # noqa: E402
from contracts.placement import Bundle  # noqa: E402

HOST = Path(__file__).resolve().parent.parent / "hosts" / "libvirt" / "host.xml"
BASE = "/var/lib/berth/pool/ubuntu-24.04.qcow2"


def seed_plan(address: str = "10.100.0.11") -> list[Bundle]:
    """Seed 004's example 2-GPU plan (slots 1 and 2 on NUMA node 0)."""
    return [
        Bundle(
            slot_id="n/1",
            slot_index=1,
            gpu_pci="0000:3c:00.0",
            fabric_parent_pci="0000:3a:00.0",
            fabric_vf_pci="0000:3a:00.2",
            nvme_device="/dev/disk/by-id/nvme-slot1",
            numa_node=0,
            vcpu_count=24,
            memory_mib=65536,
            mac_address="52:54:00:00:00:11",
            private_ip=address,
        ),
        Bundle(
            slot_id="n/2",
            slot_index=2,
            gpu_pci="0000:4b:00.0",
            fabric_parent_pci="0000:4d:00.0",
            fabric_vf_pci="0000:4d:00.2",
            nvme_device="/dev/disk/by-id/nvme-slot2",
            numa_node=0,
            vcpu_count=24,
            memory_mib=65536,
            mac_address="52:54:00:00:00:12",
            private_ip="10.100.0.12",
        ),
    ]


@pytest.fixture
def agent() -> RecordedGuestAgent:
    return RecordedGuestAgent()


@pytest.fixture
def driver(tmp_path: Path, agent: RecordedGuestAgent) -> Iterator[LibvirtVmDriver]:
    connection = libvirt.open(f"test://{HOST}")
    settings = LibvirtSettings(
        uri=f"test://{HOST}",
        storage_pool="berth",
        images={"ubuntu-24.04": BASE},
        default_image="ubuntu-24.04",
        network="berth-net",
        seed_dir=tmp_path / "seeds",
        disk_gib=20,
    )
    yield LibvirtVmDriver(settings, {0: list(range(0, 56)), 1: list(range(56, 112))}, connection, agent)
    connection.close()


def _volumes(driver: LibvirtVmDriver) -> list[str]:
    return sorted(v.name() for v in driver.connection.storagePoolLookupByName("berth").listAllVolumes())


def test_a_plan_becomes_a_running_domain_with_exactly_its_devices(driver: LibvirtVmDriver, tmp_path: Path) -> None:
    spec = VmSpec(allocation_id="a-1", node="n", bundles=seed_plan(), ssh_public_keys=["ssh-ed25519 AAAA user"])
    record = driver.create(spec)
    domain = driver.connection.lookupByName(domain_name("a-1"))
    assert domain.isActive()
    facts = parse_domain(domain.XMLDesc(0))  # as libvirt returns it
    assert sorted(facts.hostdev_sources) == ["0000:3a:00.2", "0000:3c:00.0", "0000:4b:00.0", "0000:4d:00.2"]
    assert [(d.source, d.serial) for d in facts.block_disks] == [
        ("/dev/disk/by-id/nvme-slot1", "berth-slot-1"),
        ("/dev/disk/by-id/nvme-slot2", "berth-slot-2"),
    ]
    assert (facts.vcpus, facts.memory_mib, facts.cpuset, facts.numa_nodeset) == (48, 131072, "0-55", "0")
    assert (facts.mac, facts.network, facts.has_guest_agent) == ("52:54:00:00:00:11", "berth-net", True)
    assert facts.boot_disk == f"/var/lib/berth/pool/{domain_name('a-1')}.qcow2"
    assert facts.seed_iso == str(tmp_path / "seeds" / f"{domain_name('a-1')}-seed.iso")
    assert Path(facts.seed_iso).is_file()
    assert f"{domain_name('a-1')}.qcow2" in _volumes(driver)
    assert (record.slot_indexes, record.private_ips) == ([1, 2], ["10.100.0.11", "10.100.0.12"])

    assert driver.create(spec) == record  # idempotent: the same domain, nothing new
    assert [r.allocation_id for r in driver.list()] == ["a-1"] and driver.get("a-1") == record
    assert len(driver.connection.listAllDomains(0)) == 1

    assert driver.destroy("a-1") is True
    assert driver.get("a-1") is None and driver.list() == []
    assert _volumes(driver) == ["ubuntu-24.04.qcow2"] and not Path(facts.seed_iso).exists()
    assert driver.destroy("a-1") is False  # idempotent


def test_an_unknown_image_is_refused_and_leaves_nothing(driver: LibvirtVmDriver, tmp_path: Path) -> None:
    with pytest.raises(ImageNotFound, match="image 'windows-xp' is not in this node's catalogue"):
        driver.create(VmSpec(allocation_id="a-2", node="n", bundles=seed_plan(), image="windows-xp"))
    assert driver.get("a-2") is None and _volumes(driver) == ["ubuntu-24.04.qcow2"]
    assert not (tmp_path / "seeds").exists() or list((tmp_path / "seeds").iterdir()) == []


def test_a_create_that_fails_half_way_leaves_nothing(driver: LibvirtVmDriver, tmp_path: Path) -> None:
    """A plan whose GPU address libvirt cannot use: the overlay and the seed made before it are undone."""
    broken = seed_plan()[0].model_copy(update={"gpu_pci": "0000:3c:00"})
    with pytest.raises(VmCreateError, match="libvirt could not create berth-a-4"):
        driver.create(VmSpec(allocation_id="a-4", node="n", bundles=[broken]))
    assert driver.get("a-4") is None and _volumes(driver) == ["ubuntu-24.04.qcow2"]
    assert list((tmp_path / "seeds").iterdir()) == []


def test_a_pool_without_room_is_a_create_failure_that_leaves_nothing(driver: LibvirtVmDriver) -> None:
    driver.settings = driver.settings.model_copy(update={"disk_gib": 10_000})
    with pytest.raises(VmCreateError, match="Not enough free space in pool"):
        driver.create(VmSpec(allocation_id="a-5", node="n", bundles=seed_plan()))
    assert driver.get("a-5") is None and _volumes(driver) == ["ubuntu-24.04.qcow2"]


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


def _ready_driver(driver: LibvirtVmDriver, port: int) -> LibvirtVmDriver:
    driver.gates.ssh_port = port
    driver.create(VmSpec(allocation_id="r-1", node="n", bundles=seed_plan(address="127.0.0.1")))
    return driver


def test_every_gate_passes(driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int) -> None:
    agent.outcomes = {
        "cloud-init status --wait --long": Recorded(exit_code=0, stdout="status: done", polls_before_exit=1),
        "nvidia-smi -L": Recorded(stdout="GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"),
    }
    _ready_driver(driver, listener)
    first = driver.readiness("r-1", gpu_count=2)
    assert (first.ssh, first.cloud_init, first.ready) == (True, False, False) and first.failed_gate is None
    ready = driver.readiness("r-1", gpu_count=2)
    assert ready.ready, ready.detail
    assert [line for _, line in agent.started] == [
        "cloud-init status --wait --long",
        "nvidia-smi -L",
    ]  # started once each


def test_cloud_init_failure_fails_its_gate_with_its_message(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int
) -> None:
    agent.outcomes = {
        "cloud-init status --wait --long": Recorded(exit_code=1, stdout="status: error\nerror: apt failed")
    }
    _ready_driver(driver, listener)
    report = driver.readiness("r-1", gpu_count=2)
    assert (report.failed_gate, report.failure) == ("cloud_init", "error: apt failed")


def test_recoverable_cloud_init_errors_pass(driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int) -> None:
    agent.outcomes = {
        "cloud-init status --wait --long": Recorded(exit_code=2, stdout="status: degraded done"),
        "nvidia-smi -L": Recorded(stdout="GPU 0: NVIDIA H200\nGPU 1: NVIDIA H200\n"),
    }
    _ready_driver(driver, listener)
    assert driver.readiness("r-1", gpu_count=2).ready


def test_a_guest_seeing_the_wrong_gpus_fails_the_gpus_gate(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int
) -> None:
    agent.outcomes = {
        "cloud-init status --wait --long": Recorded(exit_code=0),
        "nvidia-smi -L": Recorded(stdout="GPU 0: NVIDIA H200 (UUID: GPU-1)\n"),
    }
    _ready_driver(driver, listener)
    report = driver.readiness("r-1", gpu_count=2)
    assert (report.failed_gate, report.failure) == ("gpus", "nvidia-smi lists 1 GPUs, the plan has 2")


def test_no_ssh_and_no_guest_agent_yet_is_pending(driver: LibvirtVmDriver, agent: RecordedGuestAgent) -> None:
    agent.reachable = False
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    _ready_driver(driver, port)
    report = driver.readiness("r-1", gpu_count=2)
    assert not report.ready and report.failed_gate is None and report.pending() == ["ssh", "cloud_init", "gpus"]
    assert "guest agent not answering" in report.detail


def test_the_seed_gives_the_guest_every_bundles_address_on_its_one_nic(driver: LibvirtVmDriver, tmp_path: Path) -> None:
    driver.create(VmSpec(allocation_id="a-6", node="n", bundles=seed_plan(), ssh_public_keys=["ssh-ed25519 AAAA u"]))
    iso = pycdlib.PyCdlib()
    iso.open(str(tmp_path / "seeds" / f"{domain_name('a-6')}-seed.iso"))
    files = {}
    for name in ("meta-data", "user-data", "network-config"):
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, joliet_path=f"/{name}")
        files[name] = yaml.safe_load(out.getvalue())
    iso.close()
    assert files["meta-data"]["instance-id"] == "a-6"
    assert files["user-data"]["ssh_authorized_keys"] == ["ssh-ed25519 AAAA u"]
    assert files["network-config"]["ethernets"] == {
        "nic0": {"match": {"macaddress": "52:54:00:00:00:11"}, "addresses": ["10.100.0.11/24", "10.100.0.12/24"]}
    }


def test_a_create_retried_after_the_domain_stopped_starts_it_again(driver: LibvirtVmDriver) -> None:
    spec = VmSpec(allocation_id="a-7", node="n", bundles=seed_plan())
    record = driver.create(spec)
    domain = driver.connection.lookupByName(domain_name("a-7"))
    domain.destroy()  # the agent died between define and start, or the VM was stopped
    assert not domain.isActive()
    assert driver.create(spec) == record and domain.isActive()
    assert driver.destroy("a-7") and driver.get("a-7") is None


def test_list_shows_every_domain_named_for_an_allocation_for_the_reconciler(driver: LibvirtVmDriver) -> None:
    made = driver.create(VmSpec(allocation_id="a-1", node="n", bundles=seed_plan()))
    for name in ("berth-by-hand", "someone-elses-vm"):  # no Berth metadata in either
        xml = f"<domain type='test'><name>{name}</name><memory>1048576</memory><os><type>hvm</type></os></domain>"
        driver.connection.defineXML(xml).create()
    listed = driver.list()
    assert [(r.allocation_id, r.vm_id, r.slot_indexes) for r in listed] == [
        ("a-1", made.vm_id, [1, 2]),
        ("by-hand", "berth-by-hand", []),
    ]
    assert driver.get("by-hand").model_dump(exclude={"created_at"}) == listed[1].model_dump(exclude={"created_at"})
    assert driver.destroy("by-hand") is True  # what the reconciler's destroy_vm does to an orphan
    assert [r.allocation_id for r in driver.list()] == ["a-1"]
    assert "someone-elses-vm" in [d.name() for d in driver.connection.listAllDomains(0)]  # never touched


def test_the_guest_of_a_ready_vm_reports_each_gpu_by_its_slot(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int
) -> None:
    """Once its gates passed, the guest's `nvidia-smi -q` and kernel log are read (tests/hosts/guest/),
    the guest's GPUs in PCI order being the plan's slots in order; a VM still booting is not asked."""
    guest = Path(__file__).resolve().parent.parent / "hosts" / "guest" / "clean-two-gpus"
    xid = "[ 88.2] NVRM: Xid (PCI:0000:08:00): 95, pid=7, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No\n"
    agent.outcomes = {
        "cloud-init status --wait --long": Recorded(exit_code=0),
        "nvidia-smi -L": Recorded(stdout="GPU 0: NVIDIA H100\nGPU 1: NVIDIA H100\n"),
        "nvidia-smi -q": Recorded(stdout=(guest / "nvidia-smi-q.txt").read_text()),
        "dmesg": Recorded(stdout=(guest / "dmesg.txt").read_text() + xid),
    }
    _ready_driver(driver, listener)
    assert driver.guest_signals() == {}  # booting: its guest is not asked
    assert driver.readiness("r-1", gpu_count=2).ready
    assert driver.guest_signals() == {}  # the commands started; they answer on the next look
    found = driver.guest_signals()
    assert sorted(found) == [1, 2]  # seed_plan's slots, in plan order
    assert (found[1].answered, found[1].xids, found[2].xids) == (True, [], [95])
    driver.destroy("r-1")
    assert driver.guest_signals() == {}
