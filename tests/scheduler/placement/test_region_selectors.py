"""A request that names its GPU only through a DRA selector must be placed in the region whose pools match it,
not refused in a cheaper region whose pools do not (a region's offer is what the cluster level would accept)."""

from __future__ import annotations

from pathlib import Path

from contracts.explanation import Level
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from fleet.loader import load_fleet
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement.schedule import schedule

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fleet.yaml"
H200 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'


def test_a_selector_only_request_goes_to_the_region_that_can_serve_it() -> None:
    world = snapshot_from_fleet(load_fleet([EXAMPLE]))
    result = schedule(world, PlacementRequest(gpu_count=2, selectors=[H200]), detail=True)
    assert result.placed and result.region == "us-east"
    region_level = result.explanation.level(Level.REGION)
    assert region_level is not None and region_level.dropped == {Reason.NO_POOL_MATCHES: 1}
    assert [item.name for item in region_level.items if item.reason is Reason.NO_POOL_MATCHES] == ["eu-west"]


def test_a_named_region_is_explained_pool_by_pool() -> None:
    world = snapshot_from_fleet(load_fleet([EXAMPLE]))
    result = schedule(world, PlacementRequest(gpu_count=2, selectors=[H200], region="eu-west"), detail=True)
    assert not result.placed and result.refusal is not None and result.refusal.code is Reason.NO_MATCHING_POOL
    assert result.explanation.level(Level.POOL) is not None
