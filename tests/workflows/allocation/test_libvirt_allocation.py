"""The whole allocation workflow on the libvirt runtime: real Temporal, real PostgreSQL, and a node agent whose VMs
are real libvirt domains (libvirt's test driver; guest-agent answers recorded as QEMU documents them; the SSH gate
connects to a real listener on loopback). Active, then released, with nothing left in libvirt; cancelled while
waiting for readiness, with nothing left either."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from agent.activities import NodeAgent
from agent.approved import ApprovedSlots
from agent.host.wipe import Ran, RecordingRunner
from agent.leases import LeaseStore
from agent.libvirt.guest import Recorded, RecordedGuestAgent
from agent.reporter import NodeReporter
from agent.simulated import SimulatedTopology
from fleet.loader import load_fleet
from store.models import SlotRow
from tests.libvirt_required import libvirt_module
from tests.workflows.lab import FAST, StoreSink, lab_fleet, running_lab
from workflows.allocation import client as allocation_client

libvirt = libvirt_module()

from agent.libvirt.domain import parse_domain  # noqa: E402
from agent.libvirt.driver import LibvirtSettings, LibvirtVmDriver  # noqa: E402

HOST = Path(__file__).resolve().parents[2] / "hosts" / "libvirt" / "host.xml"
READY = {
    "cloud-init status --long": Recorded(exit_code=0, stdout="status: done"),
    "nvidia-smi -L": Recorded(stdout="GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"),
}


@pytest.fixture
def ssh_port() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


def _fleet() -> str:
    """One 2-GPU host whose slots' addresses are on loopback: the SSH gate must never leave this machine."""
    documents = list(yaml.safe_load_all(lab_fleet({"vmhost": {"gpus": 2}})))
    node = next(d for d in documents if d["kind"] == "InferenceCluster")["spec"]["nodePools"][0]["nodes"][0]
    for slot in node["slots"]:
        slot["privateIp"] = f"127.0.0.{slot['index'] + 1}"
        slot["nvmeDevice"] = f"/dev/disk/by-id/nvme-vmhost-{slot['index']}"
    return yaml.safe_dump_all(documents, sort_keys=False)


def _libvirt_agent(lab, connection, guest: RecordedGuestAgent, ssh_port: int, tmp_path: Path):
    node = next(n for pool in load_fleet([lab.fleet_file]).host_pools() for n in pool.nodes)
    settings = LibvirtSettings(
        uri=f"test://{HOST}",
        storage_pool="berth",
        images={"ubuntu": "/var/lib/berth/pool/ubuntu-24.04.qcow2"},
        default_image="ubuntu",
        network="berth-net",
        seed_dir=tmp_path / "seeds",
        disk_gib=20,
        ssh_port=ssh_port,
    )
    vms = LibvirtVmDriver(
        settings, {0: list(range(56)), 1: list(range(56, 112))}, connection, guest, runner=worker_runner()
    )
    home = tmp_path / "agent"
    return NodeAgent(
        node.name, SimulatedTopology(node), vms, LeaseStore(home / "leases"), approved=ApprovedSlots(node.slots)
    )


def worker_runner() -> RecordingRunner:
    """The host's NVMe controllers offer crypto erase (as `nvme id-ctrl -o json` reports OACS and FNA)."""
    controller = Ran(0, json.dumps({"oacs": 0x5F, "fna": 0x04}))
    return RecordingRunner({f"nvme id-ctrl /dev/disk/by-id/nvme-vmhost-{i} -o json": controller for i in range(2)})


def _left_in_libvirt(connection) -> tuple[list[str], list[str]]:
    domains = sorted(domain.name() for domain in connection.listAllDomains(0))
    volumes = sorted(volume.name() for volume in connection.storagePoolLookupByName("berth").listAllVolumes())
    return domains, volumes


async def test_active_then_released_leaves_nothing_in_libvirt(
    temporal_client, sessions, tmp_path: Path, ssh_port: int
) -> None:
    connection = libvirt.open(f"test://{HOST}")
    guest = RecordedGuestAgent(outcomes=dict(READY))
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path / "lab", _fleet(), agents=[]) as lab:
        agent = _libvirt_agent(lab, connection, guest, ssh_port, tmp_path)
        await lab.start_agent(agent.node, activities=agent.activities(), report=False)
        await NodeReporter(agent, StoreSink(sessions)).report_once()

        handle = await lab.allocate("lv-1", gpus=2)
        status = await lab.wait_for_state(handle, "active", timeout=30)
        assert status.node == "vmhost"
        [domain] = connection.listAllDomains(0)
        facts = parse_domain(domain.XMLDesc(0))
        assert sorted(facts.hostdev_sources) == ["0000:10:00.0", "0000:11:00.0", "0000:40:00.2", "0000:41:00.2"]
        assert [disk.serial for disk in facts.block_disks] == ["berth-slot-0", "berth-slot-1"]
        assert facts.mac == "52:54:00:00:00:00" and domain.isActive()

        await allocation_client.release(temporal_client, "lv-1")
        await lab.wait_for_state(handle, "released", timeout=30)
        assert _left_in_libvirt(connection) == ([], ["ubuntu-24.04.qcow2"])
        assert list((tmp_path / "seeds").iterdir()) == []
        assert agent.vms.runner.log == [
            "nvme id-ctrl /dev/disk/by-id/nvme-vmhost-0 -o json",
            "nvme format /dev/disk/by-id/nvme-vmhost-0 --ses=2 --force",
            "write 1 > /sys/bus/pci/devices/0000:10:00.0/reset",
            "nvme id-ctrl /dev/disk/by-id/nvme-vmhost-1 -o json",
            "nvme format /dev/disk/by-id/nvme-vmhost-1 --ses=2 --force",
            "write 1 > /sys/bus/pci/devices/0000:11:00.0/reset",
        ]
        assert await lab.slot_states() == {"vmhost/0": "available", "vmhost/1": "available"}
    connection.close()


async def test_cancelled_while_waiting_for_readiness_leaves_nothing(
    temporal_client, sessions, tmp_path: Path, ssh_port: int
) -> None:
    connection = libvirt.open(f"test://{HOST}")
    guest = RecordedGuestAgent(outcomes={"cloud-init status --long": Recorded(polls_before_exit=10**6)})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path / "lab", _fleet(), agents=[]) as lab:
        agent = _libvirt_agent(lab, connection, guest, ssh_port, tmp_path)
        await lab.start_agent(agent.node, activities=agent.activities(), report=False)
        await NodeReporter(agent, StoreSink(sessions)).report_once()

        handle = await lab.allocate("lv-2", gpus=2, timing=FAST)
        await lab.wait_for_state(handle, "waiting_ready", timeout=30)
        assert len(connection.listAllDomains(0)) == 1
        await handle.cancel()
        await lab.wait_for_state(handle, "cancelled", timeout=30)
        assert _left_in_libvirt(connection) == ([], ["ubuntu-24.04.qcow2"])
        assert await lab.active_claims() == {}
    connection.close()


async def test_a_gpu_whose_reset_fails_at_release_is_quarantined_and_reported_failed(
    temporal_client, sessions, tmp_path: Path, ssh_port: int
) -> None:
    """The wipe's function-level reset of one GPU is refused by the kernel (as sysfs refuses a write to
    `reset` on a device that cannot be reset). The teardown fails, the slots are quarantined with the reason, and
    the agent's next report judges that slot `failed` for its reset: it waits for an operator's repair."""
    connection = libvirt.open(f"test://{HOST}")
    guest = RecordedGuestAgent(outcomes=dict(READY))
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path / "lab", _fleet(), agents=[]) as lab:
        agent = _libvirt_agent(lab, connection, guest, ssh_port, tmp_path)
        reset = "/sys/bus/pci/devices/0000:10:00.0/reset"
        agent.vms.runner.refused_writes.add(reset)
        await lab.start_agent(agent.node, activities=agent.activities(), report=False)
        reporter = NodeReporter(agent, StoreSink(sessions))
        await reporter.report_once()

        handle = await lab.allocate("lv-3", gpus=2)
        await lab.wait_for_state(handle, "active", timeout=30)
        await allocation_client.release(temporal_client, "lv-3")
        await lab.wait_for_state(handle, "released", timeout=60)
        assert await lab.slot_states() == {"vmhost/0": "quarantined", "vmhost/1": "quarantined"}

        await reporter.report_once()
        async with sessions() as session:
            rows = await session.execute(select(SlotRow.slot_index, SlotRow.health, SlotRow.health_reason))
            health = {index: (state, reason) for index, state, reason in rows}
        assert health[1] == ("healthy", None)
        assert health[0] == (
            "failed",
            "the wipe's function-level reset failed: GPU 0000:10:00.0 reset failed: "
            f"[Errno 25] Inappropriate ioctl for device: '{reset}'",
        )
    connection.close()
