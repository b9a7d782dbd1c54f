"""Pinned nodes for allocations (docs/seeds.md, "Pinned nodes and GPUs"): a request that pins nodes runs on one of
them or is refused with `pinned_nodes_unavailable`, naming each pinned node and why; it is never placed elsewhere
(GPUStack #915)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from contracts.placement import PlacementRequest, PlanRequest
from contracts.reasons import Reason
from scheduler.placement.bundles import plan_bundles
from tests.scheduler.placement.test_placement import claim, place, snapshot


def test_a_pinned_request_only_ever_considers_the_pinned_nodes() -> None:
    result = place(snapshot(), region="us-east", nodes=["use1-a03"])
    assert result.placed
    assert [c.node for c in result.candidates] == ["use1-a03"]
    assert result.plan is not None and result.plan.node == "use1-a03"
    nodes = result.explanation.levels[-2]
    assert nodes.dropped == {Reason.NODE_NOT_PINNED: 3}  # use1-a01, use1-a02 and the shared-fabric node
    assert nodes.summary.endswith("3 are not among the pinned nodes")


def test_pinned_nodes_that_are_full_or_unfit_refuse_the_request_rather_than_placing_it_elsewhere() -> None:
    world = snapshot(claim("a1", "use1-a02", *range(7)))  # one bundle left on use1-a02; use1-a01 is wholly free
    result = place(world, region="us-east", nodes=["use1-a02", "use1-s01", "use1-m01"])
    assert not result.placed and result.candidates == []
    assert result.refusal is not None and result.refusal.code is Reason.PINNED_NODES_UNAVAILABLE
    assert result.refusal.message == (
        "no pinned nodes can take 2 GPU slices: use1-a02 has fewer than 2 compatible free bundles; "
        "use1-m01 is in pool use1/metal, which has another capacity shape; use1-s01 lacks per-slot fabric VFs"
    )
    unpinned = place(world, region="us-east")
    assert unpinned.placed and unpinned.candidates[0].node != "use1-a02"  # the capacity was there, elsewhere


def test_a_pinned_node_that_is_down_or_unknown_is_named_with_its_reason() -> None:
    down = place(snapshot(), nodes=["euw1-a01"])
    assert down.region == "eu-west"  # the pinned node decides the region
    assert down.refusal is not None and down.refusal.code is Reason.PINNED_NODES_UNAVAILABLE
    assert down.refusal.message == "no pinned node can take 2 GPU slices: euw1-a01 is not READY"

    unknown = place(snapshot(), nodes=["nope"])
    assert unknown.refusal is not None and unknown.refusal.code is Reason.PINNED_NODES_UNAVAILABLE
    assert unknown.refusal.message == "no pinned node can take 2 GPU slices: nope is not a known node"
    assert unknown.explanation.levels[0].dropped == {Reason.NO_PINNED_NODE: 4}

    elsewhere = place(snapshot(), region="us-east", nodes=["usw1-a01"])
    assert elsewhere.refusal is not None and elsewhere.refusal.code is Reason.PINNED_NODES_UNAVAILABLE
    assert (
        elsewhere.refusal.message == "no pinned node can take 2 GPU slices: usw1-a01 is in region us-west, not us-east"
    )


def test_a_pinned_node_already_tried_in_this_run_is_not_tried_again() -> None:
    result = place(snapshot(), region="us-east", nodes=["use1-a01"], exclude_nodes=["use1-a01"])
    assert result.refusal is not None and result.refusal.code is Reason.PINNED_NODES_UNAVAILABLE
    assert "use1-a01 was excluded by the request (already tried in this run)" in result.refusal.message


# use1-a01's GPUs, by slot index: 0 1b, 1 3c, 2 4b, 3 5c on NUMA node 0; 4 9a, 5 bb, 6 cd, 7 dc on NUMA node 1.
def test_pinned_gpus_are_exactly_the_slots_planned_whatever_the_address_spelling() -> None:
    world = snapshot(claim("a1", "use1-a01", 0))
    result = place(world, region="us-east", nodes=["use1-a01"], gpus=["0000:3c:00.0", "00000000:CD:00.0"])
    assert result.placed and [c.node for c in result.candidates] == ["use1-a01"]
    assert result.plan is not None and result.plan.slot_ids == ["use1-a01/1", "use1-a01/6"]
    assert [b.gpu_pci for b in result.plan.bundles] == ["0000:3c:00.0", "0000:cd:00.0"]
    unpinned = place(world, region="us-east", nodes=["use1-a01"])
    assert unpinned.plan is not None and unpinned.plan.slot_ids != result.plan.slot_ids  # free choice differs


def test_a_pinned_gpu_that_is_held_or_absent_refuses_the_request_naming_the_gpu_and_why() -> None:
    world = snapshot(
        claim("a1", "use1-a01", 0), claim("a2", "use1-a01", 1, state="leased"), quarantined=("use1-a01/4",)
    )
    held = place(
        world,
        region="us-east",
        nodes=["use1-a01"],
        gpus=["0000:1b:00.0", "0000:3c:00.0", "0000:9a:00.0", "0000:ff:00.0", "0000:dc:00.0"],
        gpu_count=5,
    )
    assert not held.placed and held.candidates == [] and held.plan is None
    assert held.refusal is not None and held.refusal.code is Reason.PINNED_NODES_UNAVAILABLE
    assert held.refusal.message == (
        "no pinned node can take 5 GPU slices: use1-a01 cannot give its pinned GPUs: "
        "GPU 0000:1b:00.0 is claimed by another allocation, GPU 0000:3c:00.0 is leased to another allocation, "
        "GPU 0000:9a:00.0 is quarantined, GPU 0000:ff:00.0 is not a GPU of use1-a01"
    )
    # The node has 5 free bundles: only the pinned GPUs' state decides.
    assert place(world, region="us-east", nodes=["use1-a01"], gpu_count=5).placed

    shared = place(snapshot(), region="us-east", nodes=["use1-s01"], gpus=["0000:1b:00.0"], gpu_count=1)
    assert shared.refusal is not None and shared.refusal.message == (
        "no pinned node can take 1 GPU slice: use1-s01 cannot give its pinned GPUs: GPU 0000:1b:00.0 has no per-slot "
        "fabric VF"
    )


def test_pinned_gpus_on_a_node_that_is_down_or_across_numa_nodes_say_so() -> None:
    down = place(snapshot(), nodes=["euw1-a01"], gpus=["0000:1b:00.0", "0000:3c:00.0"])
    assert (
        down.refusal is not None
        and down.refusal.message == "no pinned node can take 2 GPU slices: euw1-a01 is not READY"
    )
    split = place(
        snapshot(), region="us-east", nodes=["use1-a01"], gpus=["0000:1b:00.0", "0000:9a:00.0"], numa_policy="required"
    )
    assert split.refusal is not None and split.refusal.message == (
        "no pinned node can take 2 GPU slices: use1-a01 cannot fit 2 bundles on one NUMA node"
    )
    assert place(snapshot(), region="us-east", nodes=["use1-a01"], gpus=["0000:1b:00.0", "0000:9a:00.0"]).placed


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": ["0000:1b:00.0", "0000:3c:00.0"]}, "gpus can be pinned only together with exactly one pinned node"),
        ({"gpus": ["0000:1b:00.0"], "nodes": ["use1-a01"]}, "gpu_count is 2 but 1 distinct GPUs are pinned"),
        ({"gpus": ["1b:00"], "nodes": ["use1-a01"]}, "'1b:00' is not a PCI address"),
        (
            {"gpus": ["0000:1b:00.0"], "nodes": ["use1-m01"], "shape": "baremetal", "gpu_count": 1},
            "gpus can be pinned only for gpu_slice",
        ),
    ],
)
def test_gpu_pins_that_cannot_mean_anything_are_invalid_requests(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        PlacementRequest.model_validate({"gpu_count": 2, **fields})


def test_the_node_planner_takes_exactly_the_pinned_slots_or_names_the_one_it_cannot_have() -> None:
    node = snapshot(claim("a1", "use1-a01", 2)).nodes["use1-a01"]
    plan = plan_bundles(
        node, PlanRequest(allocation_id="me", gpu_count=2, gpus=frozenset({"0000:5c:00.0", "0000:dc:00.0"}))
    )
    assert plan.plan is not None and plan.plan.slot_ids == ["use1-a01/3", "use1-a01/7"]
    refused = plan_bundles(
        node, PlanRequest(allocation_id="me", gpu_count=2, gpus=frozenset({"0000:4b:00.0", "0000:dc:00.0"}))
    )
    assert refused.plan is None and refused.refusal is not None
    assert refused.refusal.code is Reason.INSUFFICIENT_BUNDLES
    assert refused.refusal.message == (
        "node use1-a01 cannot give its pinned GPUs: GPU 0000:4b:00.0 is claimed by another allocation"
    )
    mine = plan_bundles(node, PlanRequest(allocation_id="a1", gpu_count=1, gpus=frozenset({"0000:4b:00.0"})))
    assert mine.plan is not None and mine.plan.slot_ids == ["use1-a01/2"]  # re-planning its own slot
