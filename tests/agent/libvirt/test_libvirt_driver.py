"""The libvirt VM runtime against real libvirt, through its own test driver (`test:///<host.xml>`: the real library
and API, with a custom host). The guest agent is the one thing the test driver lacks; `RecordedGuestAgent` answers
as QEMU documents. The SSH gate connects to a real listener on loopback."""

from __future__ import annotations

import io
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pycdlib
import pytest
import yaml

from agent.drivers import VmCreateError
from agent.host.wipe import RecordingRunner, SlotWipe
from agent.libvirt.guest import Recorded, RecordedGuestAgent
from contracts.allocation import VmSpec
from fleet.node import Slot
from tests.libvirt_required import libvirt_module

libvirt = libvirt_module()

import agent.libvirt.driver as libvirt_driver  # noqa: E402
from agent.drivers import VmRuntimeUnavailable  # noqa: E402
from agent.libvirt.domain import DirectBoot, domain_name, parse_domain  # noqa: E402
from agent.libvirt.driver import (  # noqa: E402
    CatalogueImage,
    ImageCatalogue,
    ImageNotFound,
    LibvirtSettings,
    LibvirtVmDriver,
    choose_accelerator,
    read_console_tail,
)
from agent.libvirt.readiness import cloud_init_says  # noqa: E402
from contracts.placement import Bundle  # noqa: E402
from scheduler.host.health import HealthState, PcieSignals, SlotSignals, assess  # noqa: E402

HOST = Path(__file__).resolve().parents[2] / "hosts" / "libvirt" / "host.xml"
BASE = "/var/lib/berth/pool/ubuntu-24.04.qcow2"


def seed_plan(address: str = "10.100.0.11") -> list[Bundle]:
    """The example 2-GPU plan of docs/seeds.md, "The GPU slice bundle" (slots 1 and 2 on NUMA node 0)."""
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


HOST_CPUS = {0: list(range(0, 56)), 1: list(range(56, 112))}


def _settings(tmp_path: Path, **overrides: object) -> LibvirtSettings:
    values: dict[str, object] = {
        "uri": f"test://{HOST}",
        "storage_pool": "berth",
        "images": {"ubuntu-24.04": BASE},
        "default_image": "ubuntu-24.04",
        "network": "berth-net",
        "seed_dir": tmp_path / "seeds",
        "disk_gib": 20,
    }
    return LibvirtSettings.model_validate(values | overrides)


@pytest.fixture
def driver(tmp_path: Path, agent: RecordedGuestAgent) -> Iterator[LibvirtVmDriver]:
    connection = libvirt.open(f"test://{HOST}")
    yield LibvirtVmDriver(_settings(tmp_path), HOST_CPUS, connection, agent)
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
        "cloud-init status --long": Recorded(exit_code=0, stdout="status: done", polls_before_exit=1),
        "nvidia-smi -L": Recorded(stdout="GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"),
    }
    _ready_driver(driver, listener)
    first = driver.readiness("r-1", gpu_count=2)
    assert (first.ssh, first.cloud_init, first.ready) == (True, False, False) and first.failed_gate is None
    ready = driver.readiness("r-1", gpu_count=2)
    assert ready.ready, ready.detail
    assert [line for _, line in agent.started] == [
        "cloud-init status --long",
        "nvidia-smi -L",
    ]  # started once each


def test_cloud_init_failure_fails_its_gate_with_its_message(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int
) -> None:
    agent.outcomes = {"cloud-init status --long": Recorded(exit_code=1, stdout=CLOUD_INIT_22_4_ERROR)}
    _ready_driver(driver, listener)
    report = driver.readiness("r-1", gpu_count=2)
    assert (report.failed_gate, report.failure) == ("cloud_init", f"status: error; {RUNPARTS_FAILED}")


def test_recoverable_cloud_init_errors_pass(driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int) -> None:
    agent.outcomes = {
        "cloud-init status --long": Recorded(exit_code=2, stdout=CLOUD_INIT_23_4_DEGRADED_DONE),
        "nvidia-smi -L": Recorded(stdout="GPU 0: NVIDIA H200\nGPU 1: NVIDIA H200\n"),
    }
    _ready_driver(driver, listener)
    report = driver.readiness("r-1", gpu_count=2)
    assert report.ready and "cloud_init: done with recoverable errors: status: done" in report.detail


# `cloud-init status --long` as each cloud-init prints it (cloudinit/cmd/status.py at the tag): the dots while
# it waits, the status, then the long fields. 22.4 (Debian 12, Berth's own guest image) lists the errors under
# `detail:`; 23.4 on print the datasource there and list `errors:` and `recoverable_errors:` (by level), tab-indented;
# 24.1 on put the detail on its own line's end; 24.4 on no longer end the line of dots before `status:`.
RUNPARTS_FAILED = "('scripts_user', RuntimeError('Runparts: 1 failures in 1 attempted commands'))"
DEB822_WARNING = "Removing /etc/apt/sources.list to favor deb822 source format"
CLOUD_INIT_22_4_ERROR = f"""....
status: error
boot_status_code: enabled-by-generator
last_update: Sat, 28 Nov 2026 22:40:00 +0000
detail:
{RUNPARTS_FAILED}
"""
CLOUD_INIT_23_4_ERROR = f"""...
status: error
extended_status: error
boot_status_code: enabled-by-generator
last_update: Sat, 28 Nov 2026 22:40:00 +0000
detail:
DataSourceNoCloud [seed=/dev/vdd][dsmode=net]
errors:
\t- {RUNPARTS_FAILED}
recoverable_errors: {{}}
"""
CLOUD_INIT_23_4_DEGRADED_DONE = f"""..
status: done
extended_status: degraded done
boot_status_code: enabled-by-generator
last_update: Sat, 28 Nov 2026 22:40:00 +0000
detail:
DataSourceNoCloud [seed=/dev/vdd][dsmode=net]
errors: []
recoverable_errors:
WARNING:
\t- {DEB822_WARNING}
"""
CLOUD_INIT_24_4_ERROR = f"""....status: error
extended_status: error - done
boot_status_code: enabled-by-generator
last_update: Sat, 28 Nov 2026 22:40:00 +0000
detail: DataSourceNoCloud [seed=/dev/vdd][dsmode=net]
errors:
\t- {RUNPARTS_FAILED}
recoverable_errors: {{}}
"""


@pytest.mark.parametrize(
    ("output", "said"),
    [
        pytest.param(CLOUD_INIT_22_4_ERROR, f"status: error; {RUNPARTS_FAILED}", id="22.4"),
        pytest.param(  # the brief's shape: an older cloud-init's `time:` field instead of `last_update:`
            f"status: error\ntime: Sat, 28 Nov 2026 22:40:00 +0000\ndetail:\n{RUNPARTS_FAILED}",
            f"status: error; {RUNPARTS_FAILED}",
            id="time-field",
        ),
        pytest.param(  # 22.4 joins the errors of every stage under `detail:`, one a line
            CLOUD_INIT_22_4_ERROR.replace("detail:\n", "detail:\nConsuming user data failed!\n"),
            f"status: error; Consuming user data failed!; {RUNPARTS_FAILED}",
            id="22.4-two-stages",
        ),
        pytest.param(
            CLOUD_INIT_23_4_ERROR,
            f"status: error; {RUNPARTS_FAILED}",
            id="23.4",
        ),
        pytest.param(  # an error's recoverable errors are not what failed it: left out
            CLOUD_INIT_23_4_ERROR.replace(
                "recoverable_errors: {}", f"recoverable_errors:\nWARNING:\n\t- {DEB822_WARNING}"
            ),
            f"status: error; {RUNPARTS_FAILED}",
            id="23.4-with-warnings",
        ),
        pytest.param(
            CLOUD_INIT_24_4_ERROR.removeprefix("...."),  # 24.4 when it did not have to wait
            f"status: error; {RUNPARTS_FAILED}",
            id="24.4-no-wait",
        ),
        pytest.param("/usr/bin/cloud-init: not found", "/usr/bin/cloud-init: not found", id="not-cloud-init"),
        pytest.param("", "", id="nothing"),
    ],
)
def test_cloud_init_says_what_failed_in_its_own_words(output: str, said: str) -> None:
    assert cloud_init_says(output) == said


def test_cloud_init_says_the_status_after_24_4s_dots() -> None:
    assert cloud_init_says(CLOUD_INIT_24_4_ERROR).startswith("status: error; ")


def test_cloud_init_says_the_recoverable_errors_of_a_degraded_done() -> None:
    assert cloud_init_says(CLOUD_INIT_23_4_DEGRADED_DONE) == f"status: done; WARNING: {DEB822_WARNING}"


def test_a_guest_seeing_the_wrong_gpus_fails_the_gpus_gate(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int
) -> None:
    agent.outcomes = {
        "cloud-init status --long": Recorded(exit_code=0),
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
    guest = Path(__file__).resolve().parents[2] / "hosts" / "guest" / "clean-two-gpus"
    xid = "[ 88.2] NVRM: Xid (PCI:0000:08:00): 95, pid=7, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No\n"
    agent.outcomes = {
        "cloud-init status --long": Recorded(exit_code=0),
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


# The accelerator ---------------------------------------------------------------------------------------------------


class _Os:
    """`os` as agent/libvirt/driver.py sees it, with /dev/kvm opening or not as a test says (only there)."""

    O_RDWR = 2

    def __init__(self, kvm_error: OSError | None) -> None:
        self.kvm_error = kvm_error

    def open(self, path: str, flags: int) -> int:
        assert path == "/dev/kvm"
        if self.kvm_error is not None:
            raise self.kvm_error
        return -1

    def close(self, fd: int) -> None:
        assert fd == -1


class _OffersKvm:
    """A connection whose libvirt offers a KVM domain for x86_64 (its domain capabilities answer)."""

    def __init__(self) -> None:
        self.asked: list[tuple[object, ...]] = []

    def getDomainCapabilities(self, *args: object) -> str:
        self.asked.append(args)
        return "<domainCapabilities><domain>kvm</domain></domainCapabilities>"


def test_tcg_is_taken_as_configured_without_looking_for_kvm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libvirt_driver, "os", _Os(OSError(2, "No such file or directory")))
    assert choose_accelerator(_OffersKvm(), "tcg") == ("qemu", "configured (accelerator: tcg)")


def test_auto_takes_kvm_where_dev_kvm_opens_and_libvirt_offers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libvirt_driver, "os", _Os(None))
    offers = _OffersKvm()
    assert choose_accelerator(offers, "auto") == ("kvm", "/dev/kvm opens and libvirt offers it")
    assert choose_accelerator(offers, "kvm") == ("kvm", "configured (accelerator: kvm)")
    assert offers.asked == [(None, "x86_64", None, "kvm", 0)] * 2


def test_auto_falls_back_to_tcg_saying_why_and_kvm_asked_for_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libvirt_driver, "os", _Os(PermissionError(13, "Permission denied")))
    assert choose_accelerator(_OffersKvm(), "auto") == ("qemu", "KVM is not usable here (/dev/kvm: Permission denied)")
    with pytest.raises(
        VmCreateError, match="accelerator kvm is configured, but KVM is not usable on this host: /dev/kvm"
    ):
        choose_accelerator(_OffersKvm(), "kvm")

    # /dev/kvm opens, but libvirt offers no KVM domain: libvirt's test driver answers no domain capabilities at all.
    monkeypatch.setattr(libvirt_driver, "os", _Os(None))
    connection = libvirt.open(f"test://{HOST}")
    try:
        domain_type, why = choose_accelerator(connection, "auto")
        assert domain_type == "qemu" and why.startswith("KVM is not usable here (libvirt offers no KVM domain: ")
        with pytest.raises(VmCreateError, match="libvirt offers no KVM domain"):
            choose_accelerator(connection, "kvm")
    finally:
        connection.close()


def test_under_libvirts_test_driver_the_vms_are_tcg_and_the_host_report_says_so(
    driver: LibvirtVmDriver, tmp_path: Path, agent: RecordedGuestAgent
) -> None:
    """libvirt's test driver offers no KVM domain (it has no domain capabilities), so `auto` chooses TCG there and the
    domains it defines are `<domain type='qemu'>`, without a host CPU passed through; `kvm` cannot be configured on
    it. (The test driver would define a `type='kvm'` document: test_domain_xml.py does.)"""
    assert driver.domain_type == "qemu"
    assert driver.runtime().startswith(f"libvirt test://{HOST}: TCG (software emulation, no KVM): KVM is not usable")
    assert driver.runtime().endswith("; GPUs passed through")
    driver.create(VmSpec(allocation_id="a-1", node="n", bundles=seed_plan()))
    defined = ET.fromstring(driver.connection.lookupByName(domain_name("a-1")).XMLDesc(0))
    assert defined.get("type") == "qemu" and defined.find("cpu[@mode='host-passthrough']") is None

    connection = libvirt.open(f"test://{HOST}")
    try:
        with pytest.raises(VmCreateError, match="accelerator kvm is configured, but KVM is not usable"):
            LibvirtVmDriver(_settings(tmp_path, accelerator="kvm"), HOST_CPUS, connection, agent)
        tcg = LibvirtVmDriver(_settings(tmp_path, accelerator="tcg", passthrough=False), HOST_CPUS, connection, agent)
        assert tcg.runtime() == (
            f"libvirt test://{HOST}: TCG (software emulation, no KVM): configured (accelerator: tcg); "
            "GPUs bookkeeping only (no passthrough)"
        )
    finally:
        connection.close()


# A host without passthrough, addresses from DHCP -------------------------------------------------------------------


def test_without_passthrough_nothing_is_attached_and_the_gpus_gate_says_it_is_skipped(
    tmp_path: Path, agent: RecordedGuestAgent, listener: int
) -> None:
    connection = libvirt.open(f"test://{HOST}")
    try:
        driver = LibvirtVmDriver(_settings(tmp_path, passthrough=False), HOST_CPUS, connection, agent)
        agent.outcomes = {"cloud-init status --long": Recorded(exit_code=0, stdout="status: done")}
        _ready_driver(driver, listener)
        facts = parse_domain(connection.lookupByName(domain_name("r-1")).XMLDesc(0))
        assert (facts.hostdevs, facts.block_disks) == ([], [])
        assert facts.seed_iso == str(tmp_path / "seeds" / f"{domain_name('r-1')}-seed.iso")
        report = driver.readiness("r-1", gpu_count=2)
        assert report.ready and report.address == "127.0.0.1"
        assert "gpus: skipped: this host passes no GPU through (bookkeeping only)" in report.detail
        assert [line for _, line in agent.started] == ["cloud-init status --long"]  # no nvidia-smi
        assert driver.guest_signals() == {}  # a running VM without GPUs: nothing to ask its guest
        driver.runner = RecordingRunner({})  # whatever the wipe would run on the host is recorded
        slots = [Slot(index=i, gpu_pci=b.gpu_pci, nvme_device=f"/dev/nvme{i}n1") for i, b in enumerate(seed_plan())]
        assert driver.wipe(slots) == [SlotWipe(index=0), SlotWipe(index=1)]  # nothing was given: nothing to scrub
        assert driver.runner.log == []
    finally:
        connection.close()


def test_dhcp_addressing_leaves_the_address_to_the_network_and_waits_for_its_lease(
    tmp_path: Path, agent: RecordedGuestAgent
) -> None:
    """The seed names no address; the `ssh` gate waits for libvirt's DHCP lease of the VM's MAC (the test driver
    hands out none) and says so."""
    connection = libvirt.open(f"test://{HOST}")
    try:
        driver = LibvirtVmDriver(_settings(tmp_path, guest_addressing="dhcp"), HOST_CPUS, connection, agent)
        agent.outcomes = {"cloud-init status --long": Recorded(polls_before_exit=10**6)}
        driver.create(VmSpec(allocation_id="a-9", node="n", bundles=seed_plan()))
        iso = pycdlib.PyCdlib()
        iso.open(str(tmp_path / "seeds" / f"{domain_name('a-9')}-seed.iso"))
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, joliet_path="/network-config")
        iso.close()
        nic = yaml.safe_load(out.getvalue())["ethernets"]["nic0"]
        assert nic["match"] == {"macaddress": "52:54:00:00:00:11"} and nic.get("dhcp4") is True
        assert "addresses" not in nic
        report = driver.readiness("a-9", gpu_count=2)
        assert not report.ready and report.address is None and report.failed_gate is None
        assert "ssh: no DHCP lease for 52:54:00:00:00:11 on network berth-net yet" in report.detail
    finally:
        connection.close()


# A VM that stopped -------------------------------------------------------------------------------------------------


def test_a_vm_that_stopped_is_a_failed_gpu_reading_for_each_of_its_slots_and_a_failed_readiness(
    driver: LibvirtVmDriver, tmp_path: Path
) -> None:
    """Its QEMU gone (here: destroyed behind Berth's back) while the allocation holds its slots: each slot's guest
    reading says the VM stopped, which `assess` fails; a readiness asked of it fails the `vm` gate with the
    console's last lines."""
    driver.create(VmSpec(allocation_id="a-8", node="n", bundles=seed_plan()))
    name = domain_name("a-8")
    (tmp_path / "seeds" / f"{name}-console.log").write_text(
        "\x1b[0;32m[  OK  ]\x1b[0m Reached target cloud-init.target\r\n\r\n[  121.4] Kernel panic - not syncing\r\n"
    )
    driver.connection.lookupByName(name).destroy()

    signals = driver.guest_signals()
    assert sorted(signals) == [1, 2]
    stopped = f"the VM {name} is not running (destroyed)"
    assert all((s.answered, s.vm_stopped) == (False, stopped) for s in signals.values())
    gpu = PcieSignals(address="0000:3c:00.0", present=True, driver="vfio-pci", aer_fatal=0)
    verdict = assess(SlotSignals(index=1, gpu=gpu, guest=signals[1]))
    assert verdict.state is HealthState.FAILED
    assert verdict.reasons == [f"the VM holding the GPU stopped: {stopped}"]
    assert verdict.signals["guest"] == f"VM stopped ({stopped})"

    report = driver.readiness("a-8", gpu_count=2)
    assert (report.failed_gate, report.failure) == ("vm", "the VM stopped while booting (destroyed)")
    assert report.console == ["[  OK  ] Reached target cloud-init.target", "[  121.4] Kernel panic - not syncing"]

    assert driver.destroy("a-8") and not (tmp_path / "seeds" / f"{name}-console.log").exists()
    assert driver.guest_signals() == {}


def test_the_console_tail_is_the_last_lines_without_terminal_escapes(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    assert read_console_tail(log) == []  # no log (yet): nothing, no error
    log.write_bytes(b"".join(f"\x1b[1;31mline {n}\x1b[0m\r\n\r\n".encode() for n in range(30)) + b"\xff tail\n")
    assert read_console_tail(log, lines=3) == ["line 28", "line 29", "\ufffd tail"]


# The image catalogue and direct kernel boot ------------------------------------------------------------------------


def test_a_catalogue_image_needs_a_kernel_for_an_initrd_or_a_command_line() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="an initrd or a kernel command line needs a kernel"):
        CatalogueImage(disk="/images/debian.qcow2", initrd="/images/initrd.img")
    with pytest.raises(ValidationError, match="an initrd or a kernel command line needs a kernel"):
        CatalogueImage(disk="/images/debian.qcow2", cmdline="console=ttyS0")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        CatalogueImage(disk="/images/debian.qcow2", kernal="/images/vmlinuz")
    assert CatalogueImage(disk="/images/debian.qcow2").direct_boot() is None
    assert CatalogueImage(disk="/d.qcow2", kernel="/k/vmlinuz").direct_boot() == DirectBoot(kernel=Path("/k/vmlinuz"))
    assert CatalogueImage(
        disk="/d.qcow2", kernel="/k/vmlinuz", initrd="/k/initrd.img", cmdline="root=/dev/vda console=ttyS0"
    ).direct_boot() == DirectBoot(
        kernel=Path("/k/vmlinuz"), initrd=Path("/k/initrd.img"), cmdline="root=/dev/vda console=ttyS0"
    )


def test_the_catalogue_file_takes_a_path_or_a_disk_with_its_kernel(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text(
        "images:\n"
        "  ubuntu-24.04: /var/lib/berth/images/ubuntu-24.04.qcow2\n"
        "  berth-debian:\n"
        "    disk: /var/lib/berth/images/debian.qcow2\n"
        "    kernel: /var/lib/berth/images/vmlinuz\n"
        "    initrd: /var/lib/berth/images/initrd.img\n"
        "    cmdline: root=/dev/vda console=ttyS0\n"
        "default: berth-debian\n"
    )
    catalogue = ImageCatalogue.load(path)
    assert catalogue.images == {
        "ubuntu-24.04": "/var/lib/berth/images/ubuntu-24.04.qcow2",
        "berth-debian": CatalogueImage(
            disk="/var/lib/berth/images/debian.qcow2",
            kernel="/var/lib/berth/images/vmlinuz",
            initrd="/var/lib/berth/images/initrd.img",
            cmdline="root=/dev/vda console=ttyS0",
        ),
    }
    assert catalogue.default == "berth-debian"
    assert LibvirtSettings(images=catalogue.images, seed_dir=tmp_path).images == catalogue.images

    path.write_text("")
    assert ImageCatalogue.load(path) == ImageCatalogue()
    path.write_text("images:\n  broken:\n    disk: /d.qcow2\n    initrd: /k/initrd.img\n")
    with pytest.raises(ValueError, match="an initrd or a kernel command line needs a kernel"):
        ImageCatalogue.load(path)
    path.write_text("images:\n  a: /a.qcow2\ndefault: b\n")
    with pytest.raises(ValueError, match="the default image 'b' is not one of the catalogue's images"):
        ImageCatalogue.load(path)


def test_an_image_with_a_kernel_is_booted_directly_and_its_console_kept(
    tmp_path: Path, agent: RecordedGuestAgent
) -> None:
    image = CatalogueImage(
        disk=BASE,
        kernel="/var/lib/berth/images/vmlinuz",
        initrd="/var/lib/berth/images/initrd.img",
        cmdline="root=/dev/vda console=ttyS0",
    )
    connection = libvirt.open(f"test://{HOST}")
    try:
        driver = LibvirtVmDriver(
            _settings(tmp_path, images={"debian": image}, default_image="debian"), HOST_CPUS, connection, agent
        )
        driver.create(VmSpec(allocation_id="a-10", node="n", bundles=seed_plan()))
        name = domain_name("a-10")
        defined = ET.fromstring(connection.lookupByName(name).XMLDesc(0))
        os_ = defined.find("os")
        assert os_ is not None  # (libvirt adds its default `<boot dev='hd'/>`; the kernel is what boots)
        assert (os_.findtext("kernel"), os_.findtext("initrd"), os_.findtext("cmdline")) == (
            "/var/lib/berth/images/vmlinuz",
            "/var/lib/berth/images/initrd.img",
            "root=/dev/vda console=ttyS0",
        )
        log = defined.find("devices/serial[@type='pty']/log")
        assert log is not None and log.attrib == {
            "file": str(tmp_path / "seeds" / f"{name}-console.log"),
            "append": "off",
        }
        assert parse_domain(connection.lookupByName(name).XMLDesc(0)).boot_disk == f"/var/lib/berth/pool/{name}.qcow2"
    finally:
        connection.close()


# libvirtd restarting under the agent -------------------------------------------------------------------------------


def test_a_dead_connection_is_reopened_and_one_that_cannot_be_is_the_runtime_unavailable(
    tmp_path: Path, agent: RecordedGuestAgent
) -> None:
    first = libvirt.open(f"test://{HOST}")
    driver = LibvirtVmDriver(_settings(tmp_path), HOST_CPUS, first, agent)
    assert driver.connection is first
    first.close()  # as after libvirtd restarted: the old connection answers nothing
    second = driver.connection
    try:
        assert second is not first and second.isAlive()
        assert driver.list() == []  # the test driver's state starts over on a new connection
        driver.settings = driver.settings.model_copy(update={"uri": f"test://{tmp_path}/no-such-host.xml"})
        second.close()
        with pytest.raises(
            VmRuntimeUnavailable, match=f"libvirt at test://{tmp_path}/no-such-host.xml is not answering"
        ):
            driver.list()
    finally:
        if driver._connection is not second:
            driver._connection.close()


def test_cloud_init_still_running_is_asked_again_and_a_disabled_one_fails(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int
) -> None:
    """`cloud-init status --long` answers at once (no `--wait`): `running` waits and is asked again on a later probe;
    `disabled` fails, since such an image never reads its seed."""
    agent.outcomes = {"cloud-init status --long": Recorded(exit_code=0, stdout="status: running\ntime: now\n")}
    _ready_driver(driver, listener)
    report = driver.readiness("r-1", gpu_count=2)
    assert (report.cloud_init, report.failed_gate) == (False, None)
    assert "cloud_init: cloud-init is running" in report.detail
    agent.outcomes = {"cloud-init status --long": Recorded(exit_code=0, stdout="status: disabled\n")}
    report = driver.readiness("r-1", gpu_count=2)
    assert (report.failed_gate, report.failure) == (
        "cloud_init",
        "cloud-init is disabled in the image: no seed is read",
    )
    assert [line for _, line in agent.started] == ["cloud-init status --long", "cloud-init status --long"]


def test_a_command_the_guest_agent_never_finishes_is_asked_again(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent, listener: int
) -> None:
    """QEMU's agent can report a command as running for ever after it has gone: past `command_seconds` the gate
    gives it up, says so, and asks again, rather than wait out the readiness timeout on one lost answer."""
    now = [0.0]
    driver.gates.clock = lambda: now[0]
    agent.outcomes = {"cloud-init status --long": Recorded(exit_code=0, stdout="status: done", polls_before_exit=10**6)}
    _ready_driver(driver, listener)
    assert "cloud-init status --long` still running" in driver.readiness("r-1", gpu_count=2).detail
    now[0] = driver.gates.command_seconds
    given_up = driver.readiness("r-1", gpu_count=2)
    assert "`cloud-init status --long` gave no answer in 90s" in given_up.detail and given_up.failed_gate is None
    agent.outcomes = {"cloud-init status --long": Recorded(exit_code=0, stdout="status: done")}
    assert driver.readiness("r-1", gpu_count=2).cloud_init
    assert [line for _, line in agent.started if line.startswith("cloud-init")] == ["cloud-init status --long"] * 2


def test_ssh_is_knocked_on_sparingly_and_not_again_once_it_answered(
    driver: LibvirtVmDriver, agent: RecordedGuestAgent
) -> None:
    """Each connection makes the guest's sshd fork: while SSH is down it is tried at most every `ssh_every`
    seconds, and once it answered it is not tried again (a probe every quarter second starved an emulated guest)."""
    now = [0.0]
    driver.gates.clock = lambda: now[0]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]  # bound, not listening: connections are refused
    _ready_driver(driver, port)
    assert driver.readiness("r-1", gpu_count=2).ssh is False
    server.listen()
    assert driver.readiness("r-1", gpu_count=2).ssh is False  # not knocked on again yet
    now[0] = driver.gates.ssh_every
    assert driver.readiness("r-1", gpu_count=2).ssh is True
    server.close()
    now[0] += 10 * driver.gates.ssh_every
    assert driver.readiness("r-1", gpu_count=2).ssh is True  # it answered once: not asked again
