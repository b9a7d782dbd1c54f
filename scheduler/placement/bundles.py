"""The node scheduler's planning step: the concrete bundles one allocation gets on one host.

A pure function over the host's own view (the node agent re-reads its topology and leases, then calls this), so
the plan it returns, and the lease it then writes, reflect the host as it is now rather than the control plane's
snapshot. It judges the node with the same filter chain as the cluster scheduler, then picks slots:

- slices: compatible free bundles only (approved, own unique fabric VF, not claimed, leased or quarantined by
  anyone else); all on the NUMA node with the fewest such bundles that still fits, when policy allows; across the
  fewest NUMA nodes otherwise (policy `preferred`), or lowest slot indices (policy `none`);
- bare metal: every slot of the host;
- pinned GPUs (`PlanRequest.gpus`): exactly those slots, judged on a view where no other slot is usable
  (`scheduler.placement.pinning.pinned_slots_view`), or a refusal naming each pinned GPU that cannot be had and why.

No text here names the allocation holding a slot (tenants read it); `held_slots` gives holders as data.

Slots the allocation already claims or leases count as free, and if it already holds exactly the bundles it asks
for, those are its plan: planning the same allocation twice gives the same answer.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from contracts.explanation import Level, LevelExplanation, Refusal
from contracts.placement import Bundle, BundlePlan, CapacityShape, HeldSlot, NumaPolicy, PlanRequest
from contracts.reasons import Reason
from contracts.vocabulary import SlotState
from scheduler.compatibility import hardware_defect, profile_of, state_defect, vf_usage
from scheduler.explanation import Tally
from scheduler.host.checks import ValidationState
from scheduler.placement.node_filters import node_filters, verdict
from scheduler.placement.pinning import pinned_gpus_reason, pinned_slots_view
from scheduler.reasons import clause
from scheduler.views import NodeView, SlotView


class PlanResult(BaseModel):
    """A plan, or a refusal whose code is the node-level reason (`numa_unsatisfiable`, `slots_leased`, ...)."""

    model_config = ConfigDict(frozen=True)

    plan: BundlePlan | None
    refusal: Refusal | None
    explanation: LevelExplanation


def plan_bundles(node: NodeView, request: PlanRequest, *, detail: bool = False) -> PlanResult:
    gpus = request.gpu_count
    holder = request.allocation_id
    usable = pinned_slots_view(node, request.gpus) if request.gpus else node
    profile = profile_of(usable, holder)
    reason = verdict(profile, node_filters(request.shape, gpus, request.numa_policy))
    vf_counts = vf_usage(node)
    chosen: list[SlotView] = []
    if reason is None and request.shape is CapacityShape.GPU_SLICE:
        chosen = _pick_slices(usable, vf_counts, gpus, holder, request.numa_policy)
    elif reason is None:
        chosen = sorted(node.slots, key=lambda s: s.index)

    tally = Tally(Level.BUNDLE, "slots", f"chosen on {node.name}", gpus, detail)
    picked = {slot.id for slot in chosen}
    for slot in sorted(node.slots, key=lambda s: s.index):
        if slot.id in picked:
            defect = None
        else:
            hardware = hardware_defect(slot, vf_counts) if request.shape is CapacityShape.GPU_SLICE else None
            defect = hardware or state_defect(slot, holder) or Reason.SLOT_NOT_CHOSEN
        tally.record(defect, [str(slot.id)], _describe, slot)
    explanation = tally.explanation()

    if reason is not None:
        message = f"node {node.name} {clause(reason, gpus)} ({profile.summary()})"
        if request.gpus:
            message = f"node {node.name} {pinned_gpus_reason(node, request.gpus, reason, holder)}"
        return PlanResult(plan=None, refusal=Refusal(code=reason, message=message), explanation=explanation)
    plan = BundlePlan(
        node=node.name,
        capacity_shape=request.shape,
        gpu_count=len(chosen),
        bundles=[bundle_of(slot) for slot in chosen],
    )
    return PlanResult(plan=plan, refusal=None, explanation=explanation)


def bundle_of(slot: SlotView) -> Bundle:
    """A slot whose validation is not `valid` (a raw GPU handed over whole with bare metal) carries no fabric VF: its
    VF is absent, someone else's, or declared twice, and must not be passed through."""
    return Bundle(
        slot_id=slot.id,
        slot_index=slot.index,
        gpu_pci=slot.gpu_pci,
        fabric_parent_pci=slot.fabric_parent_pci,
        fabric_vf_pci=slot.fabric_vf_pci if slot.validation is ValidationState.VALID else None,
        nvme_device=slot.nvme_device,
        numa_node=slot.numa_node,
        vcpu_count=slot.vcpus,
        memory_mib=slot.memory_mib,
        mac_address=slot.mac,
        private_ip=slot.private_ip,
    )


def _describe(slot: SlotView) -> str:
    """A slot's per-item detail: its state ("claimed"), never who holds it (see `held_slots`)."""
    checked = f", {slot.validation}" + (f" ({slot.validation_reason})" if slot.validation_reason else "")
    return f"index {slot.index}, NUMA {slot.numa_node}, GPU {slot.gpu_pci or '?'}, {slot.state}{checked}"


def held_slots(node: NodeView) -> list[HeldSlot]:
    """Every slot of `node` that an allocation holds, by slot index."""
    return [
        HeldSlot(
            node=node.name,
            slot_id=str(slot.id),
            slot_index=slot.index,
            gpu_pci=slot.gpu_pci,
            state=slot.state,
            allocation=slot.holder,
        )
        for slot in sorted(node.slots, key=lambda s: s.index)
        if slot.holder is not None
    ]


def _pick_slices(
    node: NodeView, vf_counts: Counter[str], gpus: int, holder: str | None, numa_policy: NumaPolicy
) -> list[SlotView]:
    """Called only once the node passed the filter chain, so enough usable bundles exist (on one NUMA node, when
    that is required)."""
    usable = sorted(
        (s for s in node.slots if hardware_defect(s, vf_counts) is None and state_defect(s, holder) is None),
        key=lambda s: s.index,
    )
    held = [s for s in usable if holder is not None and s.holder == holder and s.state is not SlotState.FREE]
    if len(held) == gpus and (numa_policy is not NumaPolicy.REQUIRED or len({s.numa_node for s in held}) == 1):
        return held
    if numa_policy is NumaPolicy.NONE:
        return usable[:gpus]
    by_numa: dict[int, list[SlotView]] = {}
    for slot in usable:
        by_numa.setdefault(slot.numa_node, []).append(slot)
    fitting = [numa for numa, slots in by_numa.items() if len(slots) >= gpus]
    if fitting:
        best = min(fitting, key=lambda numa: (len(by_numa[numa]), numa))
        return by_numa[best][:gpus]
    spread = [slot for numa in sorted(by_numa, key=lambda n: (-len(by_numa[n]), n)) for slot in by_numa[numa]]
    return sorted(spread[:gpus], key=lambda s: s.index)
