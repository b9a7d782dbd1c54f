"""What makes a slot a usable slice bundle (docs/seeds.md, "A slice needs its own fabric VF"), and a node's
summary of its usable bundles.

The rules are stricter than raw GPU counting on purpose. A slot is a compatible bundle only if it is approved, has
`fabric_claim_mode=per_slot_vf` and a non-empty fabric VF address that no other slot of the node uses, and its node
agent validated it against the real host; a shared parent fabric device is not a concurrency approval. A compatible
bundle is free when no other allocation claims or leases it and it is not quarantined. A slot whose only failed
checks are about the fabric (`raw_only`) still counts as a raw GPU (docs/seeds.md, "Raw free GPUs versus
placeable slices").

Both the cluster scheduler (over a snapshot) and the node scheduler (over its own host view) judge nodes through
`NodeProfile`, so the two can only disagree when the host state itself differs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from contracts.reasons import Reason
from contracts.vocabulary import FabricClaimMode, NodeStatus, SlotState
from scheduler.breaker import Cooling
from scheduler.host.checks import ValidationState
from scheduler.host.health import HealthState
from scheduler.views import NodeView, SlotView

_VALIDATION_DEFECTS = {
    ValidationState.UNVALIDATED: Reason.SLOT_UNVALIDATED,
    ValidationState.INVALID: Reason.SLOT_INVALID,
    ValidationState.RAW_ONLY: Reason.SLOT_FABRIC_INVALID,
}

_STATE_DEFECTS = {
    SlotState.CLAIMED: Reason.SLOT_CLAIMED,
    SlotState.LEASED: Reason.SLOT_LEASED,
    SlotState.QUARANTINED: Reason.SLOT_QUARANTINED,
}


def vf_usage(node: NodeView) -> Counter[str]:
    """How many slots of the node name each fabric VF address."""
    return Counter(slot.fabric_vf_pci for slot in node.slots if slot.fabric_vf_pci)


def declared_defect(slot: SlotView, vf_counts: Counter[str]) -> Reason | None:
    """Why the slot, as the operator approved it, can never be a slice bundle (None: it could)."""
    if not slot.approved:
        return Reason.SLOT_UNAPPROVED
    if slot.fabric_claim_mode is not FabricClaimMode.PER_SLOT_VF or not slot.fabric_vf_pci:
        return Reason.SLOT_MISSING_VF
    if vf_counts[slot.fabric_vf_pci] > 1:
        return Reason.SLOT_SHARED_VF
    return None


def hardware_defect(slot: SlotView, vf_counts: Counter[str]) -> Reason | None:
    """Why the slot can never be a slice bundle as approved and validated today (None: it can)."""
    return declared_defect(slot, vf_counts) or _VALIDATION_DEFECTS.get(slot.validation)


def state_defect(slot: SlotView, holder: str | None = None) -> Reason | None:
    """Why the slot is not free for `holder` (None: it is). Slots `holder` already claims or leases count as free,
    so a node agent re-planning the same allocation gets the same answer; quarantine binds everyone. A free slot
    whose GPU is not healthy takes no new work."""
    if slot.state is SlotState.FREE:
        return None if slot.health.placeable else Reason.SLOT_UNHEALTHY
    if holder is not None and slot.holder == holder and slot.state is not SlotState.QUARANTINED:
        return None
    return _STATE_DEFECTS[slot.state]


@dataclass(frozen=True, slots=True)
class NodeProfile:
    """Everything a node's verdict and score depend on, for any request. Hashable: nodes that share a profile are
    judged once per request as a group."""

    status: NodeStatus
    agent_live: bool
    cooling_off: Cooling | None  # few nodes at a time, so a cool-off of its own costs a group of one
    gpus: int  # slots on the node, whatever their state or approval
    approved: int
    declared: int  # slots the operator approved as bundles (own VF), whatever the agent found
    raw_usable: int  # slots whose GPU validated on the host (valid or raw_only)
    compatible: int  # compatible bundles (declared and validated), whatever their state
    compatible_free: int
    compatible_leased: int
    compatible_quarantined: int
    compatible_unhealthy: int  # compatible bundles free but for their GPU's health
    degraded: int  # slots whose GPU is degraded (or unknown), whatever their state: no new work on them
    failed: int  # slots whose GPU failed, whatever their state
    raw_free: int  # usable slots no one holds, compatible or not: raw free GPUs
    numa_free: tuple[int, ...]  # compatible free bundles per NUMA node, largest first
    numa_compatible: int  # most compatible bundles (whatever their state) on one NUMA node

    @property
    def wholly_free(self) -> bool:
        return self.raw_free == self.gpus

    @property
    def best_numa_free(self) -> int:
        return self.numa_free[0] if self.numa_free else 0

    def summary(self) -> str:
        per_numa = "/".join(str(free) for free in self.numa_free) or "0"
        agent = "" if self.agent_live else ", agent down"
        cooling = f", {self.cooling_off.describe()}" if self.cooling_off else ""
        return (
            f"{self.status}{agent}{cooling}, {self.compatible_free} compatible free bundles (per NUMA node {per_numa}), "
            f"{self.raw_free}/{self.gpus} GPUs free, {self.compatible}/{self.gpus} slots approved with a per-slot VF"
        )


def profile_of(node: NodeView, holder: str | None = None) -> NodeProfile:
    vf_counts = vf_usage(node)
    approved = declared = raw_usable = compatible = free = leased = quarantined = unhealthy = raw_free = 0
    degraded = failed = 0
    free_per_numa: Counter[int] = Counter()
    compatible_per_numa: Counter[int] = Counter()
    for slot in node.slots:
        hardware = hardware_defect(slot, vf_counts)
        state = state_defect(slot, holder)
        approved += slot.approved
        failed += slot.health is HealthState.FAILED
        degraded += slot.health in (HealthState.DEGRADED, HealthState.UNKNOWN)
        declared += declared_defect(slot, vf_counts) is None
        raw_usable += slot.validation.counts_raw
        raw_free += state is None and slot.validation.counts_raw
        if hardware is not None:
            continue
        compatible += 1
        compatible_per_numa[slot.numa_node] += 1
        if state is None:
            free += 1
            free_per_numa[slot.numa_node] += 1
        elif state is Reason.SLOT_LEASED:
            leased += 1
        elif state is Reason.SLOT_QUARANTINED:
            quarantined += 1
        elif state is Reason.SLOT_UNHEALTHY:
            unhealthy += 1
    return NodeProfile(
        status=node.status,
        agent_live=node.agent_live,
        cooling_off=node.cooling_off,
        gpus=len(node.slots),
        approved=approved,
        declared=declared,
        raw_usable=raw_usable,
        compatible=compatible,
        compatible_free=free,
        compatible_leased=leased,
        compatible_quarantined=quarantined,
        compatible_unhealthy=unhealthy,
        degraded=degraded,
        failed=failed,
        raw_free=raw_free,
        numa_free=tuple(sorted(free_per_numa.values(), reverse=True)),
        numa_compatible=max(compatible_per_numa.values(), default=0),
    )
