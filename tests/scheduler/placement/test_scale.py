"""Placement at scale: the node level's counts and ranking come from per-pool-class aggregates of the snapshot
(`Snapshot.profile_counts`, `Snapshot.postings`) rather than from every node group, and must say exactly what the
group-by-group walk says (the one per-item detail takes), on fleets of many pools, after `with_nodes` and under
plans in progress."""

from __future__ import annotations

import dataclasses
import random

import pytest

from bench.placement import Busyness, synthetic_node
from contracts.placement import CapacityShape, NumaPolicy, PlacementRequest, PlacementResult, Ranking
from contracts.vocabulary import NodeStatus, PoolShape, SlotState
from fleet.region import RegionStatus
from scheduler.placement.pending import with_pending_plans
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot
from scheduler.views import NodeView, PoolView, RegionView, TenantView

GPUS = 8
SELECTOR = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("64Gi")) >= 0'


# More of every state than the benchmark's fleet, so each verdict and fallback is met.
BUSY = Busyness(shared=0.05, leased=0.1, quarantined=0.03, not_ready=0.05, agent_silent=0.02)


def _device(product: str, memory: str) -> dict[str, object]:
    return {
        "name": "gpu",
        "driver": "gpu.nvidia.com",
        "attributes": {"productName": {"string": f"NVIDIA {product}"}},
        "capacity": {"memory": {"value": memory}},
    }


def _fleet(pools: int = 24, per_pool: int = 60, seed: int = 3) -> Snapshot:
    """Pools over two regions that fall into several classes: two products, labelled and unlabelled clusters, a
    cluster not Ready, a short maximum lease, a bare-metal pool, and one node in two pools."""
    rng = random.Random(seed)
    nodes: list[NodeView] = []
    views: list[PoolView] = []
    for p in range(pools):
        names = tuple(f"p{p:02d}-n{n:03d}" for n in range(per_pool))
        nodes.extend(synthetic_node(name, rng, BUSY) for name in names)
        product, memory = ("H200", "141Gi") if p % 3 else ("H100", "80Gi")
        views.append(
            PoolView(
                cluster=f"cluster-{p // 3:02d}",
                name=f"pool-{p % 3}",
                region="us-east" if p % 2 else "us-west",
                shape=PoolShape.BAREMETAL if p == 5 else PoolShape.GPU_SLICE,
                gpu_product=product,
                nodes=names + (("p00-n000",) if p == 7 else ()),
                devices=(_device(product, memory),),
                cluster_labels={"tier": "production"} if p % 4 == 1 else {},
                cluster_ready=p != 9,
                max_lease_seconds=3600.0 if p == 11 else None,
            )
        )
    regions = [
        RegionView(name="us-east", status=RegionStatus.AVAILABLE, prices={"H200": 3.49, "H100": 2.49}),
        RegionView(name="us-west", status=RegionStatus.AVAILABLE, prices={"H200": 3.29, "H100": 2.29}),
    ]
    tenants = [TenantView(name="acme", gpu_quota=10**6)]
    return Snapshot(regions=regions, pools=views, nodes=nodes, tenants=tenants)


def _requests(snapshot: Snapshot, count: int, seed: int = 11) -> list[PlacementRequest]:
    rng = random.Random(seed)
    names = sorted(snapshot.nodes)
    requests = []
    for _ in range(count):
        shape = CapacityShape.BAREMETAL if rng.random() < 0.1 else CapacityShape.GPU_SLICE
        requests.append(
            PlacementRequest(
                gpu_count=8 if shape is CapacityShape.BAREMETAL else rng.choice([1, 2, 4, 8]),
                shape=shape,
                tenant=rng.choice(["acme", None]),
                gpu_product=rng.choice([None, "H100", "h200"]),
                region=rng.choice([None, "us-east", "us-west"]),
                cluster_selector=rng.choice([{}, {"tier": "production"}]),
                selectors=rng.choice([[], [SELECTOR]]),
                numa_policy=rng.choice(list(NumaPolicy)),
                ranking=rng.choice(list(Ranking)),
                alternates=rng.choice([0, 1, 5, 40]),
                seed=rng.choice([None, rng.randrange(1 << 31)]),
                lease_seconds=rng.choice([None, 60.0, 7200.0]),
                exclude_nodes=frozenset(rng.sample(names, rng.choice([0, 0, 1, 20]))),
                reserved_nodes=frozenset(rng.sample(names, rng.choice([0, 3]))),
            )
        )
    return requests


def _without_items(result: PlacementResult) -> dict[str, object]:
    dumped = result.model_dump(mode="json")
    for level in dumped["explanation"]["levels"]:
        level["items"] = None
    return dumped


def _aggregates(snapshot: Snapshot) -> dict[str, object]:
    """Each pool class's profile counts and postings, by profile rather than by the snapshot's profile numbers."""
    found: dict[str, object] = {}
    for region in snapshot.regions:
        for pool_class in snapshot.pool_classes(region):
            counts = snapshot.profile_counts(pool_class)
            found[pool_class.pool.key] = (
                tuple(pool.key for pool in pool_class.pools),
                {snapshot.profile(key): nodes for key, nodes in counts.items()},
                {snapshot.profile(key): snapshot.postings(pool_class, key) for key in counts},
            )
    return found


def test_pools_that_every_filter_judges_alike_form_one_class() -> None:
    snapshot = _fleet()
    classes = {pool.key: snapshot.pool_class(pool.key) for pool in snapshot.pools}
    # the same shape, product, labels, readiness, lease and devices in one region: one class, whatever the cluster
    assert classes["cluster-01/pool-0"] is classes["cluster-05/pool-0"]
    assert classes["cluster-02/pool-1"] is classes["cluster-06/pool-1"]
    assert classes["cluster-01/pool-0"] is not classes["cluster-07/pool-0"]  # labelled
    assert classes["cluster-01/pool-0"] is not classes["cluster-02/pool-1"]  # H100 and H200
    assert classes["cluster-02/pool-1"] is not classes["cluster-03/pool-2"]  # shorter leases
    assert classes["cluster-02/pool-1"] is not classes["cluster-01/pool-2"]  # bare metal
    assert classes["cluster-03/pool-0"].pools == (snapshot.pools[9],)  # the only pool of a cluster not Ready
    assert classes["cluster-01/pool-0"] is not classes["cluster-07/pool-1"]  # another region
    for region in snapshot.regions:
        pools = [pool for pool_class in snapshot.pool_classes(region) for pool in pool_class.pools]
        assert sorted(pool.key for pool in pools) == sorted(pool.key for pool in snapshot.pools_in(region))


def test_placement_without_detail_says_what_the_group_by_group_walk_says() -> None:
    snapshot = _fleet()
    placed = 0
    for request in _requests(snapshot, 120):
        plain = schedule(snapshot, request)
        assert _without_items(plain) == _without_items(schedule(snapshot, request, detail=True)), request
        placed += plain.placed
    assert placed > 60  # most of them are placed: the ranking is what is compared


def test_every_seed_walks_a_run_of_equal_scores_in_the_same_order() -> None:
    snapshot = _fleet(pools=12, per_pool=40)
    for seed in [None, *range(0, 400, 7)]:
        request = PlacementRequest(gpu_count=1, alternates=12, seed=seed, ranking=Ranking.SPREAD)
        assert _without_items(schedule(snapshot, request)) == _without_items(schedule(snapshot, request, detail=True))


def test_updated_snapshots_keep_the_aggregates_a_rebuilt_one_has() -> None:
    rng = random.Random(5)
    snapshot = _fleet()
    names = sorted(snapshot.nodes)
    requests = _requests(snapshot, 12, seed=2)
    for step in range(12):
        changed = []
        for name in rng.sample(names, rng.choice([1, 3, 40])):
            node = snapshot.nodes[name]
            state = rng.choice([SlotState.FREE, SlotState.CLAIMED, SlotState.QUARANTINED])
            slots = tuple(
                dataclasses.replace(slot, state=state, holder=None if state is not SlotState.CLAIMED else f"u{step}")
                if rng.random() < 0.5
                else slot
                for slot in node.slots
            )
            changed.append(dataclasses.replace(node, slots=slots, status=rng.choice(list(NodeStatus))))
        for request in requests:  # fill the memo of the snapshot being updated
            schedule(snapshot, request)
        snapshot = snapshot.with_nodes(changed)
        rebuilt = _rebuilt(snapshot)
        assert _aggregates(snapshot) == _aggregates(rebuilt)
        for request in requests:
            assert _without_items(schedule(snapshot, request)) == _without_items(schedule(rebuilt, request))


def _rebuilt(snapshot: Snapshot) -> Snapshot:
    """The same fleet built afresh: what an updated or overlaid snapshot's summaries must equal."""
    return Snapshot(
        regions=snapshot.regions.values(),
        pools=snapshot.pools,
        nodes=snapshot.nodes.values(),
        tenants=snapshot.tenants.values(),
    )


@pytest.mark.parametrize("plans", [1, 25])
def test_plans_in_progress_are_counted_as_a_rebuilt_snapshot_counts_them(plans: int) -> None:
    snapshot = _fleet()
    rng = random.Random(plans)
    pending = {name: [(f"plan-{name}", rng.choice([1, 2, 4]))] for name in rng.sample(sorted(snapshot.nodes), plans)}
    overlaid = with_pending_plans(snapshot, pending)
    rebuilt = _rebuilt(overlaid)
    assert _aggregates(overlaid) == _aggregates(rebuilt)
    for request in _requests(snapshot, 30, seed=plans):
        schedule(snapshot, request)  # the memo of the snapshot under the plans must not leak into the overlay
        assert _without_items(schedule(overlaid, request)) == _without_items(schedule(rebuilt, request))
