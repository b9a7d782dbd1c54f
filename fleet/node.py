"""GPU hosts of slice and bare-metal pools, and the slots (bundles) they are cut into.

A slot is a bundle (docs/seeds.md, "The GPU slice bundle"): 1 GPU + 1 fabric VF + 1 raw NVMe + CPU + memory +
MAC/IP. Only slots with `fabricClaimMode: per_slot_vf` and their own VF address can be sliced; a node whose slots
share a parent fabric device still counts its raw GPUs but cannot host concurrent slices.
"""

from __future__ import annotations

import re
from ipaddress import IPv4Address

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, field_validator

from contracts.manifest import Spec
from contracts.vocabulary import FabricClaimMode, NodeStatus
from fleet.meta import Name

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MAC_ADDRESS = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def _pci(value: str | None) -> str | None:
    if value in (None, ""):
        return None
    if not PCI_ADDRESS.match(value.lower()):
        raise ValueError(f"{value!r} is not a PCI address of the form 0000:3c:00.0")
    return value.lower()


class Slot(Spec):
    index: NonNegativeInt
    gpu_pci: str
    fabric_parent_pci: str | None = None
    fabric_vf_pci: str | None = None
    fabric_claim_mode: FabricClaimMode = FabricClaimMode.PER_SLOT_VF
    nvme_device: str | None = None
    numa_node: NonNegativeInt = 0
    vcpus: PositiveInt = 1
    memory_mib: PositiveInt = Field(default=1024, alias="memoryMiB")
    mac: str | None = None
    private_ip: IPv4Address | None = None
    approved: bool = True

    @field_validator("gpu_pci", "fabric_parent_pci", "fabric_vf_pci")
    @classmethod
    def _pci_address(cls, value: str | None) -> str | None:
        return _pci(value)

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not MAC_ADDRESS.match(value.lower()):
            raise ValueError(f"{value!r} is not a MAC address of the form 52:54:00:12:34:56")
        return value.lower()


class Simulation(Spec):
    """Faults the simulated node agent injects, so every failure path can be exercised without hardware."""

    agent_down: bool = Field(default=False, description="No agent serves this node's task queue.")
    refuse_plans: bool = Field(default=False, description="Every plan is refused as if the host topology changed.")
    fail_create: bool = Field(default=False, description="VM creation fails.")
    never_ready: bool = Field(default=False, description="VMs boot but never pass their readiness gates.")
    cloud_init_fails: bool = Field(
        default=False, description="VMs boot and cloud-init reports an error: the cloud_init gate fails for good."
    )
    wipe_fails: bool = Field(
        default=False, description="Wiping a released slot fails (its NVMe format): the slots are quarantined."
    )
    boot_seconds: NonNegativeFloat = Field(default=0.0, description="Time from VM creation to readiness.")
    create_seconds: NonNegativeFloat = Field(
        default=0.0, description="Time the VM create itself takes (a step an agent can die in the middle of)."
    )


class Node(Spec):
    name: Name
    labels: dict[str, str] = Field(default_factory=dict)
    status: NodeStatus = NodeStatus.READY
    cpus: PositiveInt = 1
    memory_mib: PositiveInt = Field(default=1024, alias="memoryMiB")
    numa_nodes: PositiveInt = 1
    slots: list[Slot] = Field(default_factory=list)
    simulation: Simulation = Field(default_factory=Simulation)


class NodeTemplate(Spec):
    """Generates `count` identical hosts, so a fleet of hundreds of nodes fits in a few lines.

    Generated names are `<namePrefix><NN>`; PCI addresses follow a fixed per-slot bus table; MACs and IPs are derived
    from the node and slot index so they are unique across the pool.
    """

    count: NonNegativeInt
    name_prefix: str
    first_index: NonNegativeInt = 1
    labels: dict[str, str] = Field(default_factory=dict)
    status: NodeStatus = NodeStatus.READY
    gpus_per_node: PositiveInt = 8
    numa_nodes: PositiveInt = 2
    vcpus_per_slot: PositiveInt = 24
    memory_mib_per_slot: PositiveInt = Field(default=65536, alias="memoryMiBPerSlot")
    fabric_claim_mode: FabricClaimMode = FabricClaimMode.PER_SLOT_VF
    ip_base: IPv4Address = IPv4Address("10.100.0.0")
    simulation: Simulation = Field(default_factory=Simulation)
