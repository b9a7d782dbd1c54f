"""Seed 001's GPU matching policy for allocations: a request that pins nodes runs on one of them or is refused with
`pinned_nodes_unavailable`, naming each pinned node and why; it is never placed elsewhere (GPUStack #915)."""

from __future__ import annotations

from test_placement import claim, place, snapshot

from scheduler.reasons import Reason


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
