"""Simulated host drivers: the hardware this machine does not have, behind the interfaces the real drivers use.

Topology is the host the node's entry in the fleet file describes (`simulated_host`), discovered as a real host
would be, so the agent validates, plans and reports through the same code as on real hardware. The VM runtime keeps real state on disk (one JSON record per
VM under the agent's state directory), so an agent restart finds its VMs again, and it injects the faults the
fleet file sets for the node (`spec.nodePools[].nodes[].simulation`): plans refused as if the host changed, VM
creation failing, VMs that never become ready, slow boots. An agent that is down is simply not started.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from agent.drivers import VmCreateError, VmRecord
from agent.guest_health import Exited, guest_signals
from agent.host.wipe import SlotWipe
from contracts.allocation import Readiness, VmSpec
from fleet.node import Node, Simulation, Slot
from scheduler.host.health import DriverSignals, SlotSignals
from scheduler.host.inventory import FabricDevice, FabricRole, Gpu, HostInventory, NumaCell, NvmeNamespace


class SimulatedTopology:
    """The host a fleet entry describes, as discovery would find it on real hardware: every slot's GPU bound to
    vfio-pci, its fabric PF with the declared VF (none where the slots share a parent), its NVMe, each device in an
    IOMMU group of its own, the node's CPUs and memory split over its NUMA nodes.

    `simulation.refusePlans` plays a host that changed after its agent started: the first discovery (the agent's
    start report) finds the fabric VFs, every later one finds them gone, as after a driver reload."""

    def __init__(self, node: Node, health_file: Path | None = None) -> None:
        self.node = node
        self.health_file = health_file
        self._discoveries = 0

    def discover(self) -> HostInventory:
        self._discoveries += 1
        vfs_gone = self.node.simulation.refuse_plans and self._discoveries > 1
        return simulated_host(self.node, with_vfs=not vfs_gone)

    def signals(self, slots: list[Slot], host: HostInventory) -> list[SlotSignals]:
        """Every approved slot's devices present, with no errors and their links at their maximum, unless
        `health_file` (the agent's `<state>/nodes/<node>/health.json`, read at each look) says otherwise for a
        slot: `{"<index>": {"gpu": {...PcieSignals...}, "xids": [79], ...}}`, as sysfs would show it on a host
        whose GPU failed. A file that cannot be read or parsed leaves every slot clean."""
        overrides: dict[str, dict[str, object]] = {}
        if self.health_file is not None and self.health_file.exists():
            try:
                overrides = json.loads(self.health_file.read_text())
            except (OSError, ValueError):
                overrides = {}
        found = []
        for slot in slots:
            if not slot.approved:
                continue
            clean = {
                "index": slot.index,
                "gpu": _clean_pcie(slot.gpu_pci),
                "fabric": _clean_pcie(slot.fabric_vf_pci) if slot.fabric_vf_pci else None,
            }
            try:
                found.append(SlotSignals.model_validate({**clean, **overrides.get(str(slot.index), {})}))
            except ValidationError:
                found.append(SlotSignals.model_validate(clean))
        return found


def _clean_pcie(address: str) -> dict[str, object]:
    return {
        "address": address,
        "present": True,
        "driver": "vfio-pci",
        "aer_fatal": 0,
        "aer_nonfatal": 0,
        "aer_correctable": 0,
        "link_speed": 32.0,
        "max_link_speed": 32.0,
        "link_width": 16,
        "max_link_width": 16,
    }


def simulated_host(node: Node, *, with_vfs: bool = True) -> HostInventory:
    groups = itertools.count(10)
    gpus = [
        Gpu(
            address=slot.gpu_pci,
            vendor_id="10de",
            device_id="0000",
            class_code="030200",
            driver="vfio-pci",
            numa_node=slot.numa_node,
            iommu_group=next(groups),
            product="NVIDIA (simulated)",
        )
        for slot in node.slots
    ]
    parents: dict[str, list[str]] = {}
    vfs: dict[str, FabricDevice] = {}
    for slot in node.slots:
        if slot.fabric_parent_pci is not None:
            parents.setdefault(slot.fabric_parent_pci, [])
        if with_vfs and slot.fabric_vf_pci is not None and slot.fabric_vf_pci not in vfs:
            vfs[slot.fabric_vf_pci] = FabricDevice(
                address=slot.fabric_vf_pci,
                vendor_id="15b3",
                device_id="101e",
                class_code="020700",
                driver="vfio-pci",
                numa_node=slot.numa_node,
                iommu_group=next(groups),
                role=FabricRole.VF,
                parent=slot.fabric_parent_pci,
            )
            if slot.fabric_parent_pci is not None:
                parents[slot.fabric_parent_pci].append(slot.fabric_vf_pci)
    numa_of = {slot.fabric_parent_pci: slot.numa_node for slot in node.slots if slot.fabric_parent_pci}
    pfs = [
        FabricDevice(
            address=pf,
            vendor_id="15b3",
            device_id="101d",
            class_code="020700",
            driver="mlx5_core",
            numa_node=numa_of[pf],
            iommu_group=next(groups),
            role=FabricRole.PF,
            vfs=sorted(children),
        )
        for pf, children in sorted(parents.items())
    ]
    nvme = [
        NvmeNamespace(
            name=f"nvme{slot.index}n1",
            wwid=f"eui.sim{node.name}{slot.index}",
            by_id=[slot.nvme_device] if slot.nvme_device.startswith("/dev/disk/by-id/") else [],
            numa_node=slot.numa_node,
        )
        for slot in node.slots
        if slot.nvme_device is not None
    ]
    cpus_per_cell = max(node.cpus // node.numa_nodes, 1)
    numa = [
        NumaCell(
            id=cell,
            cpus=list(range(cell * cpus_per_cell, (cell + 1) * cpus_per_cell)),
            memory_mib=node.memory_mib // node.numa_nodes,
        )
        for cell in range(node.numa_nodes)
    ]
    devices = [*gpus, *pfs, *vfs.values()]
    return HostInventory(
        hostname=node.name,
        gpus=sorted(gpus, key=lambda g: g.address),
        fabric=sorted([*pfs, *vfs.values()], key=lambda d: d.address),
        nvme=nvme,
        numa=numa,
        iommu_groups={device.iommu_group: [device.address] for device in devices if device.iommu_group is not None},
    )


class SimulatedVmDriver:
    def __init__(self, state_dir: Path, simulation: Simulation, clock: Callable[[], float] = time.time) -> None:
        self.vm_dir = state_dir / "vms"
        self.vm_dir.mkdir(parents=True, exist_ok=True)
        self.wipe_log = state_dir / "wipes.log"
        self.guest_dir = state_dir / "guest"
        self.simulation = simulation
        self.clock = clock

    def _path(self, allocation_id: str) -> Path:
        return self.vm_dir / f"{allocation_id.replace('/', '_')}.json"

    def runtime(self) -> str:
        return "simulated VMs (nothing boots)"

    def ready_when_created(self) -> bool:
        return self.simulation.boot_seconds == 0

    def create(self, spec: VmSpec) -> VmRecord:
        existing = self.get(spec.allocation_id)
        if existing is not None:
            return existing
        if self.simulation.fail_create:
            raise VmCreateError(f"simulated fault: VM creation fails on {spec.node}")
        time.sleep(self.simulation.create_seconds)  # a hypervisor defining and starting a domain takes a while
        record = VmRecord(
            vm_id=f"vm-{spec.allocation_id}",
            allocation_id=spec.allocation_id,
            slot_indexes=[b.slot_index for b in spec.bundles],
            private_ips=[b.private_ip for b in spec.bundles if b.private_ip],
            created_at=self.clock(),
        )
        partial = self._path(spec.allocation_id).with_suffix(".partial")
        partial.write_text(record.model_dump_json(indent=2))
        os.replace(partial, self._path(spec.allocation_id))
        return record

    def get(self, allocation_id: str) -> VmRecord | None:
        try:
            return VmRecord.model_validate_json(self._path(allocation_id).read_text())
        except (FileNotFoundError, ValidationError, json.JSONDecodeError):
            return None

    def list(self) -> list[VmRecord]:
        records = (self.get(path.stem) for path in sorted(self.vm_dir.glob("*.json")))
        return [record for record in records if record is not None]

    def readiness(self, allocation_id: str, gpu_count: int) -> Readiness:
        record = self.get(allocation_id)
        if record is None:
            return Readiness(ssh=False, cloud_init=False, nvidia_smi=False, detail="no such VM")
        if self.simulation.cloud_init_fails:
            return Readiness(
                ssh=True,
                cloud_init=False,
                nvidia_smi=False,
                detail="cloud_init: status: error",
                failed_gate="cloud_init",
                failure="simulated fault: cloud-init status: error",
            )
        if self.simulation.never_ready:
            return Readiness(ssh=True, cloud_init=False, nvidia_smi=False, detail="simulated fault: cloud-init hangs")
        booted = (self.clock() - record.created_at) / max(self.simulation.boot_seconds, 1e-9)
        return Readiness(
            ssh=booted >= 0.5,
            cloud_init=booted >= 0.9,
            nvidia_smi=booted >= 1.0,
            detail=f"nvidia-smi sees {gpu_count} GPUs" if booted >= 1.0 else "booting",
        )

    def destroy(self, allocation_id: str) -> bool:
        try:
            self._path(allocation_id).unlink()
            return True
        except FileNotFoundError:
            return False

    def guest_signals(self) -> dict[int, DriverSignals]:
        """A simulated guest says nothing of its GPUs unless `<state>/guest/<allocation>.json` holds what its
        commands printed, `{"nvidia_smi": {"exit_code": 0, "stdout": "..."}, "dmesg": {...}}` (recorded `nvidia-smi
        -q` and kernel logs, tests/hosts/guest/); that is read through the same parser as a real guest's answer."""
        found: dict[int, DriverSignals] = {}
        for record in self.list():
            try:
                said = json.loads((self.guest_dir / f"{record.allocation_id}.json").read_text())
                smi = Exited(**said["nvidia_smi"])
                kernel = Exited(**said["dmesg"]) if "dmesg" in said else None
            except (OSError, ValueError, KeyError, TypeError):
                continue
            found.update(zip(record.slot_indexes, guest_signals(smi, kernel, len(record.slot_indexes)), strict=False))
        return found

    def wipe(self, slots: list[Slot]) -> list[SlotWipe]:
        """Records the wipe it would do (`wipes.log`); `simulation.wipeFails` plays an NVMe whose format fails."""
        if self.simulation.wipe_fails:
            return [
                SlotWipe(
                    index=s.index,
                    error=f"NVMe {s.nvme_device or 'of slot ' + str(s.index)}: simulated fault: format failed",
                )
                for s in slots
            ]
        with open(self.wipe_log, "a") as log:
            log.write(json.dumps({"at": self.clock(), "slots": [slot.index for slot in slots]}) + "\n")
        return [SlotWipe(index=slot.index, nvme_method="simulated", gpu_reset=True) for slot in slots]
