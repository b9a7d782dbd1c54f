"""What a node agent needs from its host, as two small interfaces: the topology it can discover, and a VM runtime.

The real drivers read sysfs, `nvidia-smi` and the fabric and NVMe inventory, and drive libvirt; the simulated ones
(simulated.py) stand in for hardware this machine does not have. Everything else in the agent (planning, leases,
activities) is the same code for both.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from activities.contracts import Readiness, VmSpec
from scheduler.views import NodeView


class VmCreateError(RuntimeError):
    """The runtime could not create the VM (a libvirt error, a device that failed to attach, ...)."""


class VmRecord(BaseModel):
    """What the runtime knows about one VM: enough to find its devices again after an agent restart."""

    vm_id: str
    allocation_id: str
    slot_indexes: list[int]
    private_ips: list[str] = Field(default_factory=list)
    created_at: float  # epoch seconds


class TopologyDriver(Protocol):
    def discover(self) -> NodeView:
        """The host's slots as the hardware is now, every slot FREE (the agent overlays leases and VMs)."""
        ...


class VmDriver(Protocol):
    def create(self, spec: VmSpec) -> VmRecord:
        """Create and boot a VM with the plan's devices attached. Idempotent by allocation id."""
        ...

    def get(self, allocation_id: str) -> VmRecord | None: ...

    def list(self) -> list[VmRecord]: ...

    def readiness(self, allocation_id: str, gpu_count: int) -> Readiness:
        """Probe the readiness gates once: SSH port reachable, cloud-init finished, nvidia-smi sees the GPUs."""
        ...

    def destroy(self, allocation_id: str) -> bool:
        """Stop and delete the VM; True if there was one. Idempotent."""
        ...

    def wipe(self, slot_indexes: list[int]) -> None:
        """Scrub the slots' NVMe devices and reset their GPUs before the slots are reused."""
        ...
