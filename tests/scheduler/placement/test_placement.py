"""Region and cluster scheduling (docs/seeds.md, "Four layers, each deciding only what it knows") over small
fleets written the way an operator writes them."""

from __future__ import annotations

import pytest

from contracts.placement import CapacityShape, PlacementRequest, PlacementResult, Ranking
from contracts.reasons import Reason
from fleet.loader import parse_fleet
from fleet.slot_state import SlotStateDocument
from scheduler import cel
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot

FLEET = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: us-east}
spec: {status: available, jurisdiction: us, prices: {H200: 3.49, H100: 2.49}}
---
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: us-west}
spec: {status: degraded, jurisdiction: us, prices: {H200: 2.99}}
---
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: eu-west}
spec: {status: available, jurisdiction: eu, prices: {H200: 3.89}}
---
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: ap-south}
spec: {status: unavailable, jurisdiction: in, prices: {H200: 1.99}}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: acme}
spec: {gpuQuota: 16}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: globex}
spec: {gpuQuota: 64, requiredJurisdiction: eu}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: initech}
spec: {gpuQuota: 64, allowedRegions: [us-west]}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceClass
metadata: {name: h200}
spec:
  devices:
  - name: gpu
    driver: gpu.nvidia.com
    attributes: {productName: {string: NVIDIA H200}}
    capacity: {memory: {value: 141Gi}}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: use1, labels: {tier: production}}
spec:
  region: us-east
  nodePools:
  - name: slices
    className: h200
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 3, namePrefix: use1-a, gpusPerNode: 8, numaNodes: 2}
  - name: shared
    className: h200
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 1, namePrefix: use1-s, gpusPerNode: 8, numaNodes: 2, fabricClaimMode: shared_parent}
  - name: metal
    className: h200
    shape: baremetal
    gpuProduct: H200
    nodeTemplate: {count: 2, namePrefix: use1-m, gpusPerNode: 8, numaNodes: 2}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: usw1, labels: {tier: staging}}
spec:
  region: us-west
  nodePools:
  - name: slices
    className: h200
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 2, namePrefix: usw1-a, gpusPerNode: 8, numaNodes: 2}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: euw1, labels: {tier: production}}
spec:
  region: eu-west
  nodePools:
  - name: slices
    className: h200
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 1, namePrefix: euw1-a, gpusPerNode: 8, numaNodes: 2, status: DOWN}
"""


def snapshot(*holds: dict[str, object], quarantined: tuple[str, ...] = (), fleet: str = FLEET) -> Snapshot:
    state = SlotStateDocument.model_validate(
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "SlotState",
            "metadata": {"name": "test"},
            "spec": {"allocations": list(holds), "quarantined": list(quarantined)},
        }
    )
    return snapshot_from_fleet(parse_fleet([("fleet.yaml", fleet)]), [state])


def claim(allocation: str, node: str, *indexes: int, tenant: str = "acme", state: str = "claimed") -> dict[str, object]:
    return {"id": allocation, "tenant": tenant, "state": state, "slots": [f"{node}/{i}" for i in indexes]}


def place(world: Snapshot, **fields: object) -> PlacementResult:
    return schedule(world, PlacementRequest.model_validate({"gpu_count": 2, **fields}), detail=True)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"region": "ap-south"}, Reason.REGION_UNAVAILABLE),
        ({"region": "us-east", "tenant": "initech"}, Reason.REGION_NOT_ALLOWED),
        ({"region": "us-east", "tenant": "globex"}, Reason.JURISDICTION_MISMATCH),
        ({"region": "us-east", "required_jurisdiction": "eu"}, Reason.JURISDICTION_MISMATCH),
        ({"region": "us-west", "gpu_product": "H100"}, Reason.PRODUCT_NOT_OFFERED),
        ({"region": "us-west", "shape": "baremetal", "gpu_count": 8}, Reason.PRODUCT_NOT_OFFERED),
        ({"region": "mars"}, Reason.UNKNOWN_REGION),
    ],
)
def test_a_named_region_is_validated_and_refused_with_its_reason(fields: dict[str, object], code: Reason) -> None:
    result = place(snapshot(), **fields)
    assert not result.placed and result.refusal is not None
    assert result.refusal.code is code
    assert result.refusal.message.startswith(f"region {fields['region']} ")


def test_without_a_region_the_best_allowed_region_wins() -> None:
    world = snapshot()
    # us-west is cheaper but degraded, ap-south cheapest but unavailable, eu-west dearer: us-east.
    assert place(world).region == "us-east"
    assert place(world, tenant="globex").refusal.code is Reason.INSUFFICIENT_CAPACITY  # eu-west's only node is DOWN
    assert place(world, tenant="globex").region == "eu-west"
    assert place(world, tenant="initech").region == "us-west"


def test_a_region_with_room_beats_a_cheaper_or_healthier_one_without() -> None:
    full = [claim(f"a{n}", f"use1-a{n:02d}", *range(8)) for n in (1, 2, 3)]
    result = place(snapshot(*full, fleet=FLEET.replace("gpuQuota: 16", "gpuQuota: 64")))
    assert result.placed and result.region == "us-west"


def test_no_allowed_region_offering_the_product_is_no_region() -> None:
    result = place(snapshot(), gpu_product="H100", tenant="globex")
    assert result.refusal is not None and result.refusal.code is Reason.NO_REGION
    level = result.explanation.levels[1]
    assert (level.considered, level.passed) == (4, 0)
    assert level.dropped == {Reason.JURISDICTION_MISMATCH: 3, Reason.PRODUCT_NOT_OFFERED: 1}


def test_quota_counts_active_and_in_flight_gpus() -> None:
    world = snapshot(claim("a1", "use1-a01", *range(8)), claim("a2", "use1-a02", 0, 1, 2, 3, 4, 5, state="leased"))
    refused = place(world, tenant="acme", gpu_count=3)
    assert refused.refusal is not None and refused.refusal.code is Reason.QUOTA_EXCEEDED
    assert "8 active + 6 in flight + 3 requested > quota 16" in refused.refusal.message
    assert place(world, tenant="acme", gpu_count=2).placed


def test_pools_are_filtered_by_cluster_labels_shape_and_product() -> None:
    world = snapshot()
    staged = place(world, region="us-east", cluster_selector={"tier": "staging"})
    assert staged.refusal is not None and staged.refusal.code is Reason.NO_MATCHING_POOL
    pools = staged.explanation.levels[1]
    assert pools.dropped == {Reason.SHAPE_MISMATCH: 1, Reason.CLUSTER_LABELS_MISMATCH: 2}

    metal = place(world, region="us-east", shape="baremetal", gpu_count=8)
    assert metal.placed and metal.candidates[0].pool == "use1/metal"


def test_shared_parent_fabric_node_is_never_a_slice_candidate() -> None:
    result = place(snapshot(), region="us-east", alternates=10)
    assert [c.node for c in result.candidates] == ["use1-a01", "use1-a02", "use1-a03"]
    nodes = result.explanation.levels[2]
    assert nodes.summary == "3/4 nodes can take 2 GPU slices: 1 lacks per-slot fabric VFs"


def test_binpack_fills_partly_used_nodes_first_and_spread_picks_the_emptiest() -> None:
    world = snapshot(claim("a1", "use1-a02", 0, 1, 2, 3, 4, 5), claim("a2", "use1-a03", 0, 1))
    assert [c.node for c in place(world, region="us-east").candidates] == ["use1-a02", "use1-a03", "use1-a01"]
    spread = place(world, region="us-east", ranking=Ranking.SPREAD)
    assert [c.node for c in spread.candidates] == ["use1-a01", "use1-a03", "use1-a02"]


def test_only_wholly_free_hosts_are_bare_metal_candidates() -> None:
    world = snapshot(claim("a1", "use1-m01", 7))
    result = place(world, region="us-east", shape=CapacityShape.BAREMETAL, gpu_count=8)
    assert [c.node for c in result.candidates] == ["use1-m02"]
    world = snapshot(claim("a1", "use1-m01", 7), quarantined=("use1-m02/0",))
    result = place(world, region="us-east", shape=CapacityShape.BAREMETAL, gpu_count=8)
    assert result.refusal is not None and result.refusal.code is Reason.INSUFFICIENT_CAPACITY
    assert result.explanation.levels[-1].dropped == {Reason.NODE_IN_USE: 2}


def test_refusal_tells_no_compatible_bundles_from_insufficient_capacity() -> None:
    world = snapshot(*(claim(f"a{n}", f"use1-a{n:02d}", *range(7)) for n in (1, 2, 3)))
    busy = place(world, region="us-east", tenant=None, gpu_count=2)
    assert busy.refusal is not None and busy.refusal.code is Reason.INSUFFICIENT_CAPACITY
    assert busy.refusal.message == (
        "us-east: 0/4 nodes can take 2 GPU slices: 3 have fewer than 2 compatible free bundles, "
        "1 lacks per-slot fabric VFs"
    )
    never = place(snapshot(), region="us-east", gpu_count=9)
    assert never.refusal is not None and never.refusal.code is Reason.NO_COMPATIBLE_BUNDLES


def test_alternates_exclusions_and_seeded_tie_breaks() -> None:
    world = snapshot()
    assert len(place(world, region="us-east", alternates=1).candidates) == 2
    retry = place(world, region="us-east", exclude_nodes=["use1-a01"])
    assert [c.node for c in retry.candidates] == ["use1-a02", "use1-a03"]
    assert retry.explanation.levels[2].dropped[Reason.NODE_EXCLUDED] == 1

    by_seed = {seed: [c.node for c in place(world, region="us-east", seed=seed).candidates] for seed in range(3)}
    assert by_seed[0] == ["use1-a01", "use1-a02", "use1-a03"]
    assert by_seed[1] == ["use1-a02", "use1-a03", "use1-a01"]
    assert place(world, region="us-east", seed=1) == place(world, region="us-east", seed=1)


def test_the_plan_preview_is_the_node_schedulers_plan_on_the_chosen_node() -> None:
    result = place(snapshot(claim("a1", "use1-a01", 0, 1, 2)), region="us-east", gpu_count=1)
    assert result.chosen is not None and result.chosen.node == "use1-a01"
    assert result.plan is not None and result.plan.slot_ids == ["use1-a01/3"]  # NUMA 0 has 1 left: best fit


def test_dra_cel_selectors_pick_pools_by_their_gpu_device() -> None:
    world = snapshot()
    product = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'
    memory = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("100Gi")) >= 0'
    assert place(world, region="us-east", selectors=[product, memory]).placed

    too_big = place(world, region="us-east", selectors=[product, memory.replace("100Gi", "200Gi")])
    assert too_big.refusal is not None and too_big.refusal.code is Reason.NO_MATCHING_POOL
    assert too_big.explanation.levels[1].dropped == {Reason.SELECTOR_MISMATCH: 2, Reason.SHAPE_MISMATCH: 1}

    broken = place(world, region="us-east", selectors=['device.attributes["gpu.nvidia.com"].rack == "r1"'])
    pools = broken.explanation.levels[1]
    assert pools.dropped == {Reason.SELECTOR_ERROR: 2, Reason.SHAPE_MISMATCH: 1}
    assert pools.items is not None
    assert all("rack" in item.detail for item in pools.items if item.reason is Reason.SELECTOR_ERROR)


def test_each_selector_meets_each_distinct_device_once() -> None:
    world = snapshot()  # every pool shares one InferenceClass, so one GPU device
    # Expressions no other test uses: the selector cache is process-wide.
    selectors = [
        'device.driver == "gpu.nvidia.com" && "test_placement" != ""',
        'device.attributes["gpu.nvidia.com"].productName != "test_placement"',
    ]
    before = cel.evaluation_count()
    place(world, selectors=selectors)
    place(world, selectors=selectors, region="us-west")
    assert cel.evaluation_count() - before == len(selectors)


def test_a_selector_that_does_not_compile_is_a_bad_request() -> None:
    with pytest.raises(cel.SelectorCompileError):
        place(snapshot(), selectors=["device.driver =="])


def test_binpack_keeps_wholly_free_nodes_free_even_when_they_would_fit_tighter() -> None:
    small = "  - name: small\n    className: h200\n    shape: gpu_slice\n    gpuProduct: H200\n"
    small += "    nodeTemplate: {count: 1, namePrefix: use1-t, gpusPerNode: 4, numaNodes: 1}\n"
    world = snapshot(
        claim("a1", "use1-a02", 0, 1), fleet=FLEET.replace("  - name: shared\n", small + "  - name: shared\n")
    )
    ranked = [c.node for c in place(world, region="us-east").candidates]
    assert ranked == ["use1-a02", "use1-t01", "use1-a01", "use1-a03"]  # 6 free on a used node beats 4 on a whole one
