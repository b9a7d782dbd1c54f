"""Simulated host drivers: the hardware this machine does not have, behind the interfaces the real drivers use.

Topology comes from the node's entry in the fleet file. The VM runtime keeps real state on disk (one JSON record per
VM under the agent's state directory), so an agent restart finds its VMs again, and it injects the faults the
fleet file sets for the node (`spec.nodePools[].nodes[].simulation`): plans refused as if the host changed, VM
creation failing, VMs that never become ready, slow boots. An agent that is down is simply not started.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from activities.contracts import Readiness, VmSpec
from activities.node.drivers import VmCreateError, VmRecord
from fleet.node import FabricClaimMode, Node, Simulation
from scheduler.from_fleet import node_view
from scheduler.views import NodeView


class SimulatedTopology:
    def __init__(self, node: Node) -> None:
        self.node = node

    def discover(self) -> NodeView:
        view = node_view(self.node)
        if not self.node.simulation.refuse_plans:
            return view
        # As if a driver reload dropped the fabric VFs: the host no longer matches its approved inventory.
        changed = tuple(
            dataclasses.replace(slot, fabric_vf_pci=None, fabric_claim_mode=FabricClaimMode.NONE) for slot in view.slots
        )
        return dataclasses.replace(view, slots=changed)


class SimulatedVmDriver:
    def __init__(self, state_dir: Path, simulation: Simulation, clock: Callable[[], float] = time.time) -> None:
        self.vm_dir = state_dir / "vms"
        self.vm_dir.mkdir(parents=True, exist_ok=True)
        self.wipe_log = state_dir / "wipes.log"
        self.simulation = simulation
        self.clock = clock

    def _path(self, allocation_id: str) -> Path:
        return self.vm_dir / f"{allocation_id.replace('/', '_')}.json"

    def create(self, spec: VmSpec) -> VmRecord:
        existing = self.get(spec.allocation_id)
        if existing is not None:
            return existing
        if self.simulation.fail_create:
            raise VmCreateError(f"simulated fault: VM creation fails on {spec.node}")
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

    def wipe(self, slot_indexes: list[int]) -> None:
        with open(self.wipe_log, "a") as log:
            log.write(json.dumps({"at": self.clock(), "slots": slot_indexes}) + "\n")
