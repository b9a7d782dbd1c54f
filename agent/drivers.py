"""What a node agent needs from its host, as two small interfaces: the topology it can discover, and a VM runtime.

The real topology driver (`host/topology.py`) reads sysfs and NVML; the simulated one (simulated.py) describes the
hardware of the node's fleet entry, which this machine does not have. Both return the same `HostInventory`, and
everything after discovery (validating the approved slots, planning, leases, reports, activities) is the same code
for both.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from agent.host.wipe import SlotWipe
from contracts.allocation import Readiness, VmSpec
from fleet.node import Slot
from scheduler.host.health import DriverSignals, SlotSignals
from scheduler.host.inventory import HostInventory


class VmCreateError(RuntimeError):
    """The runtime could not create the VM (a libvirt error, a device that failed to attach, ...)."""


class VmRuntimeUnavailable(RuntimeError):
    """The runtime itself did not answer (libvirtd restarting): the step is retried, nothing is judged failed."""


class ImageNotFound(VmCreateError):
    """The requested image is not in the node's image catalogue: a refusal of the request, not a fault of the node."""


class VmRecord(BaseModel):
    """What the runtime knows about one VM: enough to find its devices again after an agent restart."""

    vm_id: str
    allocation_id: str
    # The node whose agent made it: where several agents share one hypervisor (a dev stack, the tests), each sees
    # only its own VMs. None in records made before it was kept, and for domains without Berth's metadata.
    node: str | None = None
    slot_indexes: list[int]
    private_ips: list[str] = Field(default_factory=list)
    created_at: float  # epoch seconds


class TopologyDriver(Protocol):
    def discover(self) -> HostInventory:
        """What the host has now. Never raises for a fact it cannot read: that is a `HostProblem` in the result."""
        ...

    def signals(self, slots: list[Slot], host: HostInventory) -> list[SlotSignals]:
        """What the host can see of each approved slot's devices now: presence, AER counters, links.
        Never raises: an unreadable fact is an absent signal."""
        ...


class VmDriver(Protocol):
    def runtime(self) -> str:
        """One line for the host report: which runtime, which accelerator and why, whether GPUs pass through."""
        ...

    def create(self, spec: VmSpec) -> VmRecord:
        """Create and boot a VM with the plan's devices attached. Idempotent by allocation id."""
        ...

    def ready_when_created(self) -> bool:
        """Whether a VM of this runtime can pass its readiness gates the moment it exists, so that the create's own
        readiness look (`VmSpec.first_look`) can spare the allocation its `wait_ready` step. False wherever a guest
        boots: there the look would only find it booting."""
        ...

    def get(self, allocation_id: str) -> VmRecord | None: ...

    def list(self) -> list[VmRecord]: ...

    def readiness(self, allocation_id: str, gpu_count: int) -> Readiness:
        """Probe the readiness gates once: SSH port reachable, cloud-init finished, nvidia-smi sees the GPUs."""
        ...

    def destroy(self, allocation_id: str) -> bool:
        """Stop and delete the VM; True if there was one. Idempotent."""
        ...

    def guest_signals(self) -> dict[int, DriverSignals]:
        """What each active VM's guest says of its GPUs, by slot index (agent/libvirt/guest_health.py).
        Never blocks on a guest and never raises: a guest that does not answer is a reading that says so."""
        ...

    def wipe(self, slots: list[Slot]) -> list[SlotWipe]:
        """Scrub the slots' NVMe devices and reset their GPUs before the slots are reused; one outcome per slot
        (a failure is an outcome with its error, never an exception)."""
        ...
