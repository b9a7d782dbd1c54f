"""The node scheduler's bundle planning (docs/seeds.md, "The GPU slice bundle"): which slots one allocation gets
on one host, or why none."""

from __future__ import annotations

import dataclasses

from contracts.explanation import Level
from contracts.placement import CapacityShape, NumaPolicy, PlanRequest
from contracts.reasons import Reason
from contracts.vocabulary import NodeStatus, SlotState
from fleet.node import FabricClaimMode
from scheduler.host.checks import ValidationState
from scheduler.placement.bundles import plan_bundles
from scheduler.views import NodeView, SlotView


def slot(
    index: int,
    *,
    numa: int = 0,
    approved: bool = True,
    mode: FabricClaimMode = FabricClaimMode.PER_SLOT_VF,
    vf: str | None = "",
    state: SlotState = SlotState.FREE,
    holder: str | None = None,
) -> SlotView:
    return SlotView(
        id=f"h01/{index}",
        index=index,
        approved=approved,
        fabric_claim_mode=mode,
        fabric_vf_pci=f"0000:{index + 0x1A:02x}:00.2" if vf == "" else vf,
        numa_node=numa,
        state=state,
        holder=holder,
        gpu_pci=f"0000:{index + 0x3C:02x}:00.0",
        fabric_parent_pci=f"0000:{index + 0x1A:02x}:00.0",
        nvme_device=f"/dev/disk/by-id/nvme-{index}",
        vcpus=24,
        memory_mib=65536,
        mac=f"52:54:00:00:00:{index:02x}",
        private_ip=f"10.100.0.{10 + index}",
    )


def host(*slots: SlotView, status: NodeStatus = NodeStatus.READY) -> NodeView:
    return NodeView(name="h01", status=status, slots=slots, numa_nodes=2)


def ask(gpus: int, numa: NumaPolicy = NumaPolicy.PREFERRED, allocation: str | None = "a1") -> PlanRequest:
    return PlanRequest(allocation_id=allocation, gpu_count=gpus, numa_policy=numa)


def test_two_gpu_plan_has_seed_shape_and_stays_on_the_tightest_numa_node() -> None:
    node = host(slot(0), slot(1), slot(2), slot(3, numa=1), slot(4, numa=1))
    result = plan_bundles(node, ask(2))
    assert result.refusal is None and result.plan is not None
    assert result.plan.slot_ids == ["h01/3", "h01/4"]  # NUMA 1 has 2 free: the best fit; NUMA 0's 3 stay together
    first = result.plan.model_dump(mode="json")["bundles"][0]
    assert first == {
        "slot_id": "h01/3",
        "slot_index": 3,
        "gpu_pci": "0000:3f:00.0",
        "fabric_parent_pci": "0000:1d:00.0",
        "fabric_vf_pci": "0000:1d:00.2",
        "nvme_device": "/dev/disk/by-id/nvme-3",
        "numa_node": 1,
        "vcpu_count": 24,
        "memory_mib": 65536,
        "mac_address": "52:54:00:00:00:03",
        "private_ip": "10.100.0.13",
    }
    assert result.plan.capacity_shape == "gpu_slice" and result.plan.gpu_count == 2


def test_only_compatible_free_bundles_are_picked_and_every_other_slot_is_accounted_for() -> None:
    node = host(
        slot(0, approved=False),
        slot(1, mode=FabricClaimMode.SHARED_PARENT, vf=None),
        slot(2, vf="0000:99:00.2"),
        slot(3, vf="0000:99:00.2"),  # two slots naming one VF: neither is a concurrency approval
        slot(4, state=SlotState.CLAIMED, holder="other"),
        slot(5),
        slot(6, state=SlotState.LEASED, holder="other"),
        slot(7),
        slot(8, state=SlotState.QUARANTINED),
    )
    result = plan_bundles(node, ask(2))
    assert result.plan is not None and result.plan.slot_ids == ["h01/5", "h01/7"]
    level = result.explanation
    assert level.level is Level.BUNDLE and (level.considered, level.passed) == (9, 2)
    assert level.dropped == {
        Reason.SLOT_SHARED_VF: 2,
        Reason.SLOT_UNAPPROVED: 1,
        Reason.SLOT_MISSING_VF: 1,
        Reason.SLOT_CLAIMED: 1,
        Reason.SLOT_LEASED: 1,
        Reason.SLOT_QUARANTINED: 1,
    }


def test_numa_required_refuses_a_split_that_preferred_accepts() -> None:
    node = host(slot(0), slot(1, state=SlotState.CLAIMED, holder="x"), slot(2, numa=1), slot(3, numa=1, approved=False))
    required = plan_bundles(node, ask(2, NumaPolicy.REQUIRED))
    assert required.plan is None and required.refusal is not None
    assert required.refusal.code is Reason.NUMA_UNSATISFIABLE
    preferred = plan_bundles(node, ask(2, NumaPolicy.PREFERRED))
    assert preferred.plan is not None and preferred.plan.slot_ids == ["h01/0", "h01/2"]


def test_preferred_split_uses_the_fewest_numa_nodes() -> None:
    node = host(slot(0), slot(1, numa=1), slot(2, numa=1), slot(3, numa=1), slot(4, numa=2))
    result = plan_bundles(node, ask(4))
    assert result.plan is not None
    assert [b.numa_node for b in result.plan.bundles].count(1) == 3  # all of NUMA 1, then one more


def test_numa_policy_none_takes_the_lowest_indices() -> None:
    node = host(slot(0), slot(1, numa=1), slot(2, numa=1), slot(3, numa=1))
    result = plan_bundles(node, ask(2, NumaPolicy.NONE))
    assert result.plan is not None and result.plan.slot_ids == ["h01/0", "h01/1"]


def test_shared_parent_fabric_node_is_refused_for_slices_with_a_topology_reason() -> None:
    node = host(*(slot(i, mode=FabricClaimMode.SHARED_PARENT, vf=None) for i in range(8)))
    result = plan_bundles(node, ask(1))
    assert result.plan is None and result.refusal is not None
    assert result.refusal.code is Reason.MISSING_PER_SLOT_VF
    assert "lacks per-slot fabric VFs" in result.refusal.message


def test_slots_leased_to_another_allocation_refuse_but_its_own_lease_is_replanned_identically() -> None:
    node = host(slot(0), slot(1, state=SlotState.LEASED, holder="a1"), slot(2, state=SlotState.LEASED, holder="a1"))
    other = plan_bundles(node, ask(2, allocation="a2"))
    assert other.refusal is not None and other.refusal.code is Reason.SLOTS_LEASED
    again = plan_bundles(node, ask(2, allocation="a1"))
    assert again.plan is not None and again.plan.slot_ids == ["h01/1", "h01/2"]


def test_busy_and_not_ready_nodes_are_refused() -> None:
    busy = host(slot(0), slot(1, state=SlotState.CLAIMED, holder="x"))
    result = plan_bundles(busy, ask(2))
    assert result.refusal is not None and result.refusal.code is Reason.INSUFFICIENT_BUNDLES
    down = host(slot(0), slot(1), status=NodeStatus.DOWN)
    result = plan_bundles(down, ask(2))
    assert result.refusal is not None and result.refusal.code is Reason.NODE_NOT_READY


def test_bare_metal_takes_every_slot_of_a_wholly_free_host_only() -> None:
    slots = [slot(i, numa=i // 4, mode=FabricClaimMode.SHARED_PARENT, vf=None) for i in range(8)]
    whole = PlanRequest(allocation_id="a1", gpu_count=8, shape=CapacityShape.BAREMETAL)
    result = plan_bundles(host(*slots), whole)
    assert result.plan is not None and len(result.plan.bundles) == 8 and result.plan.capacity_shape == "baremetal"

    slots[3] = slot(3, state=SlotState.QUARANTINED)
    refused = plan_bundles(host(*slots), whole)
    assert refused.refusal is not None and refused.refusal.code is Reason.NODE_IN_USE

    smaller = PlanRequest(allocation_id="a1", gpu_count=4, shape=CapacityShape.BAREMETAL)
    refused = plan_bundles(host(*[slot(i) for i in range(8)]), smaller)
    assert refused.refusal is not None and refused.refusal.code is Reason.NODE_SIZE_MISMATCH


def test_validation_decides_slices_and_bare_metal_never_passes_a_bad_vf_through() -> None:
    """The agent's verdicts: an invalid slot is never planned; a raw-only slot (its VF failed validation) is a raw GPU
    for bare metal, handed over without the VF; a host with an invalid slot takes no bare-metal request."""
    raw_only = dataclasses.replace(slot(1), validation=ValidationState.RAW_ONLY, validation_reason="vf_absent")
    invalid = dataclasses.replace(slot(2), validation=ValidationState.INVALID, validation_reason="gpu_not_vfio")

    sliced = plan_bundles(host(slot(0), raw_only, invalid, slot(3)), PlanRequest(allocation_id="a", gpu_count=2))
    assert sliced.plan is not None and [b.slot_index for b in sliced.plan.bundles] == [0, 3]
    three = plan_bundles(host(slot(0), raw_only, invalid, slot(3)), PlanRequest(allocation_id="b", gpu_count=3))
    assert three.refusal is not None and three.refusal.code is Reason.SLOTS_INVALID

    metal = plan_bundles(
        host(slot(0), raw_only), PlanRequest(allocation_id="c", gpu_count=2, shape=CapacityShape.BAREMETAL)
    )
    assert metal.plan is not None
    assert [(b.slot_index, b.fabric_vf_pci) for b in metal.plan.bundles] == [(0, "0000:1a:00.2"), (1, None)]
    broken = plan_bundles(
        host(slot(0), invalid), PlanRequest(allocation_id="d", gpu_count=2, shape=CapacityShape.BAREMETAL)
    )
    assert broken.refusal is not None and broken.refusal.code is Reason.SLOTS_INVALID
