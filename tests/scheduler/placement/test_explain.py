"""Explanations: "why is my allocation pending?" answered level by level, with counts that add up."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contracts.explanation import Level, LevelExplanation
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from fleet.loader import parse_fleet
from fleet.slot_state import SlotStateDocument
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot

FLEET = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: us-east}
spec: {prices: {H200: 3.0}}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: acme}
spec: {gpuQuota: 1000}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceClass
metadata: {name: h200}
spec: {devices: [{name: gpu}]}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: use1}
spec:
  region: us-east
  nodePools:
  - {name: busy, className: h200, shape: gpu_slice, gpuProduct: H200,
     nodeTemplate: {count: 80, namePrefix: busy-, gpusPerNode: 8}}
  - {name: down, className: h200, shape: gpu_slice, gpuProduct: H200,
     nodeTemplate: {count: 10, namePrefix: down-, gpusPerNode: 8, status: DOWN}}
  - {name: shared, className: h200, shape: gpu_slice, gpuProduct: H200,
     nodeTemplate: {count: 6, namePrefix: shared-, gpusPerNode: 8, fabricClaimMode: shared_parent}}
  - {name: metal, className: h200, shape: baremetal, gpuProduct: H200,
     nodeTemplate: {count: 2, namePrefix: metal-, gpusPerNode: 8}}
"""


def crowded(free_on_busy: int = 1) -> Snapshot:
    """80 nodes with only `free_on_busy` bundles free each, 10 DOWN, 6 without per-slot VFs."""
    taken = [f"busy-{n:02d}/{i}" for n in range(1, 81) for i in range(8 - free_on_busy)]
    state = {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "SlotState",
        "metadata": {"name": "peak"},
        "spec": {"allocations": [{"id": "everyone", "tenant": "acme", "slots": taken}]},
    }
    return snapshot_from_fleet(parse_fleet([("f.yaml", FLEET)]), [SlotStateDocument.model_validate(state)])


def test_pending_allocation_reads_as_one_line_per_level() -> None:
    result = schedule(crowded(), PlacementRequest(gpu_count=2, tenant="acme"))
    assert not result.placed and result.refusal is not None
    assert result.refusal.code is Reason.INSUFFICIENT_CAPACITY
    assert [level.summary for level in result.explanation.levels] == [
        "1/1 tenants are admitted",
        "1/1 regions can serve 2 GPU slices",
        "3/4 pools match: 1 has another capacity shape",
        "0/96 nodes can take 2 GPU slices: 80 have fewer than 2 compatible free bundles, 10 are not READY, "
        "6 lack per-slot fabric VFs",
    ]
    assert result.explanation.summary == result.refusal.message
    assert result.refusal.message.endswith(result.explanation.levels[-1].summary)


def test_counts_add_up_and_items_are_listed_only_on_request() -> None:
    request = PlacementRequest(gpu_count=2)
    plain = schedule(crowded(), request)
    assert all(level.items is None for level in plain.explanation.levels)
    detailed = schedule(crowded(), request, detail=True)
    for level in detailed.explanation.levels:
        assert level.items is not None and len(level.items) == level.considered
        assert level.considered == level.passed + sum(level.dropped.values())
        reasons = [item.reason for item in level.items if item.reason is not None]
        assert {reason: reasons.count(reason) for reason in set(reasons)} == level.dropped
    nodes = detailed.explanation.level(Level.NODE)
    assert nodes is not None and nodes.items is not None
    down = next(item for item in nodes.items if item.name == "down-01")
    assert down.reason is Reason.NODE_NOT_READY and down.detail.startswith("use1/down: DOWN")


def test_a_placement_explains_its_choice_down_to_the_slots() -> None:
    result = schedule(crowded(free_on_busy=3), PlacementRequest(gpu_count=2), detail=True)
    assert result.placed and result.chosen is not None and result.chosen.pool == "use1/busy"
    bundle = result.explanation.level(Level.BUNDLE)
    assert bundle is not None and bundle.summary == (
        f"2/8 slots chosen on {result.chosen.node}: 5 are claimed by other allocations, 1 is usable but was not chosen"
    )


def test_levels_refuse_counts_that_do_not_add_up() -> None:
    with pytest.raises(ValidationError, match="considered"):
        LevelExplanation(level=Level.NODE, considered=3, passed=1, dropped={Reason.NODE_NOT_READY: 1}, summary="")


def test_result_json_has_a_stable_shape() -> None:
    result = schedule(crowded(free_on_busy=3), PlacementRequest(gpu_count=2, tenant="acme"), detail=True)
    document = json.loads(result.model_dump_json())
    assert set(document) == {
        "placed",
        "region",
        "candidates",
        "plan",
        "refusal",
        "explanation",
        "holders",
        "preemption",
    }
    assert set(document["candidates"][0]) == {"node", "pool", "cluster", "region", "free_bundles"}
    assert set(document["plan"]) == {"node", "capacity_shape", "gpu_count", "bundles"}
    assert set(document["explanation"]) == {"summary", "levels"}
    level = document["explanation"]["levels"][0]
    assert set(level) == {"level", "considered", "passed", "dropped", "summary", "items"}
    assert set(level["items"][0]) == {"name", "reason", "detail"}
    assert [entry["level"] for entry in document["explanation"]["levels"]] == [
        "tenant",
        "region",
        "pool",
        "node",
        "bundle",
    ]
    refused = json.loads(schedule(crowded(), PlacementRequest(gpu_count=2)).model_dump_json())
    assert refused["refusal"]["code"] == "insufficient_capacity" and refused["plan"] is None
