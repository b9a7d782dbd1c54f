"""Faults on a real hypervisor: a guest that gets no address, and libvirtd restarting under the agent.

- No address: the allocation workflow (real Temporal and PostgreSQL) on a node agent whose VMs are real guests on a
  network that hands out no addresses. The `ssh` gate waits for a lease that never comes; at the readiness deadline
  the attempt fails with that reason, and the saga undoes everything: no domain, no disk, no seed, no claim.
- libvirtd restarting: a create while libvirtd is down is `VmRuntimeUnavailable` (retried by the activity, never a
  failed create) and leaves nothing; once libvirtd is back the same driver creates the VM; a restart under a running
  guest leaves the guest running and the driver reconnects by itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.activities import NodeAgent
from agent.approved import ApprovedSlots
from agent.drivers import VmRuntimeUnavailable
from agent.leases import LeaseStore
from agent.libvirt.driver import LibvirtVmDriver
from agent.reporter import NodeReporter
from agent.simulated import SimulatedTopology
from devstack.real_vms import domains_on, guest_host_settings
from fleet.loader import load_fleet
from tests.real_vm.conftest import URI, VmNetwork, free_subnet, make_driver, network_xml, vm_spec
from tests.workflows.lab import FAST, StoreSink, lab_fleet, running_lab

pytestmark = [pytest.mark.real_vm, pytest.mark.xdist_group("real_vm")]


@pytest.fixture
def silent_network(real_libvirt) -> Iterator[VmNetwork]:
    """A network with no DHCP at all: a guest on it never gets an address."""
    suffix = uuid.uuid4().hex[:6]
    network = VmNetwork(name=f"berth-nodhcp-{suffix}", bridge=f"brn-{suffix}", subnet=free_subnet())
    real_libvirt.networkCreateXML(network_xml(network, dhcp=False))
    yield network
    real_libvirt.networkLookupByName(network.name).destroy()


def _fleet(mac: str) -> str:
    documents = list(yaml.safe_load_all(lab_fleet({"vmhost": {"gpus": 1}})))
    node = next(d for d in documents if d["kind"] == "InferenceCluster")["spec"]["nodePools"][0]["nodes"][0]
    for slot in node["slots"]:
        slot.update(mac=mac, vcpus=1, memoryMiB=640)
        slot.pop("privateIp", None)  # the network is to give the address, and gives none
    return yaml.safe_dump_all(documents, sort_keys=False)


async def test_a_guest_that_gets_no_address_fails_at_the_readiness_deadline_with_that_reason(
    temporal_client, sessions, tmp_path: Path, real_libvirt, guest_image, silent_network, vm_pool
) -> None:
    mac = "52:54:00:be:0a:01"
    pool_name, folder = vm_pool
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path / "lab", _fleet(mac), agents=[]) as lab:
        node = next(n for pool in load_fleet([lab.fleet_file]).host_pools() for n in pool.nodes)
        settings = guest_host_settings(guest_image, silent_network.name, pool_name, folder, accelerator="tcg")
        vms = LibvirtVmDriver(settings, {0: sorted(os.sched_getaffinity(0))}, node=node.name)
        agent = NodeAgent(
            node.name, SimulatedTopology(node), vms, LeaseStore(tmp_path / "leases"), approved=ApprovedSlots(node.slots)
        )
        await lab.start_agent(agent.node, activities=agent.activities(), report=False)
        await NodeReporter(agent, StoreSink(sessions)).report_once()

        handle = await lab.allocate("rv-noaddr", gpus=1, timing=FAST)
        status = await lab.wait_for_state(handle, "failed", timeout=120)
        [attempt] = status.attempts
        assert attempt.reason is not None
        assert attempt.reason.startswith("readiness_timeout: not ready after 20s: waiting for ssh"), attempt.reason
        assert f"ssh: no DHCP lease for {mac} on network {silent_network.name} yet" in attempt.reason
        assert domains_on(real_libvirt, folder) == []
        assert [p.name for p in folder.iterdir() if "rv-noaddr" in p.name] == []
        assert await lab.active_claims() == {}


def _libvirtd_pid() -> int | None:
    try:
        return int(Path("/run/libvirtd.pid").read_text())
    except (OSError, ValueError):
        return None


def _ours_to_restart() -> bool:
    """Only a libvirtd that scripts/test-prerequisites.sh started is this test's to stop and start again."""
    try:
        pid = _libvirtd_pid()
        recorded = int(Path("/run/berth-test-libvirtd.pid").read_text())
        # /run can outlive its processes (a machine restored from a snapshot): the pid must still be libvirtd's.
        return recorded == pid and Path(f"/proc/{pid}/comm").read_text().strip() == "libvirtd"
    except (OSError, ValueError):
        return False


def _stop_libvirtd() -> None:
    pid = _libvirtd_pid()
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "libvirtd did not stop"
        time.sleep(0.1)


def _start_libvirtd() -> None:
    subprocess.run(["libvirtd", "--daemon"], check=True)
    deadline = time.monotonic() + 30
    while subprocess.run(["virsh", "-c", URI, "version"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "libvirtd did not come back"
        time.sleep(0.2)
    Path("/run/berth-test-libvirtd.pid").write_text(Path("/run/libvirtd.pid").read_text())


def test_libvirtd_restarting_under_the_agent_loses_nothing_and_leaks_nothing(
    real_libvirt, guest_image, vm_network, vm_pool, ssh_key
) -> None:
    if not _ours_to_restart():
        pytest.skip(
            "LOUD: libvirtd here was not started by scripts/test-prerequisites.sh, so this test will not restart it: "
            "the libvirtd-restart test did NOT run"
        )
    _, public_key = ssh_key
    _, folder = vm_pool
    driver = make_driver(guest_image, vm_network, vm_pool)
    spec = vm_spec("rv-restart", "52:54:00:be:0b:01", public_key)
    try:
        _stop_libvirtd()
        with pytest.raises(VmRuntimeUnavailable, match="libvirt at qemu:///system is not answering"):
            driver.create(spec)
    finally:
        _start_libvirtd()
    assert [p.name for p in folder.iterdir() if "rv-restart" in p.name] == []  # a create that failed made nothing

    driver.create(spec)  # the same driver, reconnected: what the activity's retry does
    time.sleep(3)  # the guest booting, libvirt's start of it long finished
    _stop_libvirtd()
    _start_libvirtd()
    import libvirt

    fresh = libvirt.open(URI)
    try:
        assert fresh.lookupByName("berth-rv-restart").isActive()  # the guest outlived libvirtd's restart
    finally:
        fresh.close()
    report = driver.readiness("rv-restart", gpu_count=1)  # answers again without a new driver
    assert report.failed_gate is None, report
    assert driver.destroy("rv-restart") is True
    assert [p.name for p in folder.iterdir() if "rv-restart" in p.name] == []
