"""Properties of the scheduler over random inventories and requests (hypothesis).

The checks here recompute each fact from the raw slots in the simplest possible way, independent of the
scheduler's profiles and filter chain, so a bug there cannot hide behind itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.explanation import Level
from contracts.placement import CapacityShape, NumaPolicy, PlacementRequest, PlacementResult, PlanRequest, Ranking
from contracts.reasons import Reason
from contracts.vocabulary import NodeStatus, PoolShape, SlotState
from fleet.node import FabricClaimMode
from fleet.region import RegionStatus
from scheduler.compatibility import profile_of
from scheduler.placement.bundles import plan_bundles
from scheduler.placement.capacity import allocations_on
from scheduler.placement.pools import filter_pools
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot
from scheduler.views import NodeView, PoolView, RegionView, SlotView, TenantView

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRODUCTS = ("H200", "H100")


@st.composite
def slots_of(draw: st.DrawFn, node: str) -> tuple[SlotView, ...]:
    count = draw(st.integers(1, 8))
    result = []
    for index in range(count):
        state = draw(st.sampled_from(list(SlotState)))
        result.append(
            SlotView(
                id=f"{node}/{index}",
                index=index,
                approved=draw(st.sampled_from([True, True, True, False])),
                fabric_claim_mode=draw(st.sampled_from([FabricClaimMode.PER_SLOT_VF] * 3 + list(FabricClaimMode))),
                fabric_vf_pci=draw(st.sampled_from([f"vf-{index}", f"vf-{index}", "vf-shared", None])),
                numa_node=draw(st.integers(0, 1)),
                state=SlotState.FREE if draw(st.integers(0, 2)) else state,
                holder=None if state is SlotState.FREE else draw(st.sampled_from(["a1", "a2"])),
                gpu_pci=f"gpu-{index}",
            )
        )
    return tuple(result)


@st.composite
def worlds(draw: st.DrawFn) -> Snapshot:
    regions = [
        RegionView(
            name=f"r{i}",
            status=RegionStatus.AVAILABLE if i == 0 else draw(st.sampled_from(list(RegionStatus))),
            jurisdiction=draw(st.sampled_from(["us", "eu"])),
            prices={product: draw(st.floats(0.5, 5)) for product in PRODUCTS if draw(st.booleans())},
        )
        for i in range(draw(st.integers(1, 2)))
    ]
    pools, nodes = [], []
    for p in range(draw(st.integers(1, 4))):
        names = [f"p{p}-n{n}" for n in range(draw(st.integers(0, 5)))]
        for name in names:
            status = draw(st.sampled_from([NodeStatus.READY] * 4 + list(NodeStatus)))
            nodes.append(NodeView(name=name, status=status, slots=draw(slots_of(name)), numa_nodes=2))
        pools.append(
            PoolView(
                cluster=f"c{p % 2}",
                name=f"p{p}",
                region="r0" if p == 0 else draw(st.sampled_from(regions)).name,
                shape=PoolShape.GPU_SLICE if p == 0 else draw(st.sampled_from(list(PoolShape)[:2])),
                gpu_product=draw(st.sampled_from(PRODUCTS)),
                nodes=tuple(names),
                cluster_labels={"tier": draw(st.sampled_from(["prod", "dev"]))},
                cluster_ready=draw(st.booleans() | st.just(True)),
            )
        )
    tenant = TenantView(
        name="t0",
        gpu_quota=draw(st.integers(0, 64)),
        allowed_regions=draw(st.sampled_from([None, None, frozenset(), frozenset(r.name for r in regions[:1])])),
        required_jurisdiction=draw(st.sampled_from([None, None, None, "us", "eu"])),
        active_gpus=draw(st.integers(0, 8)),
        in_flight_gpus=draw(st.integers(0, 4)),
    )
    return Snapshot(regions=regions, pools=pools, nodes=nodes, tenants=[tenant])


@st.composite
def requests(draw: st.DrawFn, world: Snapshot) -> PlacementRequest:
    return PlacementRequest(
        gpu_count=draw(st.sampled_from([1, 1, 2, 2, 3, 4, 8])),
        gpu_product=draw(st.sampled_from([None, None, *PRODUCTS])),
        shape=draw(st.sampled_from([CapacityShape.GPU_SLICE] * 3 + [CapacityShape.BAREMETAL])),
        region=draw(st.sampled_from([None, None, *world.regions])),
        tenant=draw(st.sampled_from([None, "t0"])),
        cluster_selector=draw(st.sampled_from([{}, {}, {"tier": "prod"}])),
        numa_policy=draw(st.sampled_from(list(NumaPolicy))),
        ranking=draw(st.sampled_from(list(Ranking))),
        alternates=draw(st.integers(0, 5)),
        exclude_nodes=frozenset(draw(st.lists(st.sampled_from(sorted(world.nodes) or ["none"]), max_size=3))),
        seed=draw(st.none() | st.integers(0, 1000)),
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[Snapshot, PlacementRequest]:
    world = draw(worlds())
    return world, draw(requests(world))


# --- independent facts about raw slots ---


def usable_for_slices(node: NodeView) -> list[SlotView]:
    """Approved, own per-slot VF unique on the node, and held by no one."""
    vfs = Counter(s.fabric_vf_pci for s in node.slots)
    return [
        s
        for s in node.slots
        if s.approved
        and s.fabric_claim_mode is FabricClaimMode.PER_SLOT_VF
        and s.fabric_vf_pci
        and vfs[s.fabric_vf_pci] == 1
        and s.state is SlotState.FREE
    ]


def fits(node: NodeView, request: PlacementRequest) -> bool:
    if node.status is not NodeStatus.READY:
        return False
    if request.shape is CapacityShape.BAREMETAL:
        return len(node.slots) == request.gpu_count and all(s.state is SlotState.FREE for s in node.slots)
    usable = usable_for_slices(node)
    if request.numa_policy is NumaPolicy.REQUIRED:
        return max(Counter(s.numa_node for s in usable).values(), default=0) >= request.gpu_count
    return len(usable) >= request.gpu_count


def node_reason_holds(reason: Reason, node: NodeView, request: PlacementRequest) -> bool:
    g = request.gpu_count
    if reason is Reason.NODE_NOT_READY:
        return node.status is not NodeStatus.READY
    if reason is Reason.NODE_EXCLUDED:
        return node.name in request.exclude_nodes
    if reason is Reason.NODE_TOO_SMALL:
        return len(node.slots) < g
    if reason is Reason.NODE_SIZE_MISMATCH:
        return len(node.slots) != g
    if reason is Reason.SLOTS_UNAPPROVED:
        return sum(s.approved for s in node.slots) < g
    if reason is Reason.NODE_IN_USE:
        return any(s.state is not SlotState.FREE for s in node.slots)
    if reason in (Reason.MISSING_PER_SLOT_VF, Reason.INSUFFICIENT_BUNDLES, Reason.SLOTS_QUARANTINED):
        return len(usable_for_slices(node)) < g
    if reason is Reason.SLOTS_LEASED:
        return len(usable_for_slices(node)) < g and any(s.state is SlotState.LEASED for s in node.slots)
    if reason is Reason.NUMA_UNSATISFIABLE:
        return max(Counter(s.numa_node for s in usable_for_slices(node)).values(), default=0) < g
    return False


def check_counts(result: PlacementResult) -> None:
    for level in result.explanation.levels:
        assert level.considered == level.passed + sum(level.dropped.values())
        assert level.items is not None and len(level.items) == level.considered
        assert sum(item.reason is None for item in level.items) == level.passed


@SETTINGS
@given(cases())
def test_placements_only_use_usable_slots_and_agree_with_the_node_scheduler(case: tuple) -> None:
    world, request = case
    result = schedule(world, request, detail=True)
    check_counts(result)
    if not result.placed:
        assert result.candidates == [] and result.plan is None and result.refusal is not None
        return
    assert result.plan is not None and 1 <= len(result.candidates) <= 1 + request.alternates
    assert len({c.node for c in result.candidates}) == len(result.candidates)
    for candidate in result.candidates:
        node = world.nodes[candidate.node]
        assert candidate.node not in request.exclude_nodes and candidate.region == result.region
        assert fits(node, request)
        intent = PlanRequest(gpu_count=request.gpu_count, shape=request.shape, numa_policy=request.numa_policy)
        assert plan_bundles(node, intent).plan is not None  # the node scheduler accepts every candidate
    node = world.nodes[result.plan.node]
    ids = result.plan.slot_ids
    assert len(ids) == len(set(ids)) == request.gpu_count
    chosen = [s for s in node.slots if s.id in ids]
    if request.shape is CapacityShape.BAREMETAL:
        assert len(chosen) == len(node.slots) and all(s.state is SlotState.FREE for s in node.slots)
    else:
        assert all(s in usable_for_slices(node) for s in chosen)
        if request.numa_policy is NumaPolicy.REQUIRED:
            assert len({s.numa_node for s in chosen}) == 1


@SETTINGS
@given(cases())
def test_every_drop_and_refusal_is_for_a_reason_true_of_the_snapshot(case: tuple) -> None:
    world, request = case
    result = schedule(world, request, detail=True)
    tenant = world.tenants["t0"] if request.tenant else None
    required = {j for j in (request.required_jurisdiction, tenant and tenant.required_jurisdiction) if j}
    for level in result.explanation.levels:
        for item in level.items or []:
            if level.level is Level.NODE:
                node = world.nodes[item.name]
                if item.reason is None:
                    assert fits(node, request)
                else:
                    assert node_reason_holds(item.reason, node, request), (item, node)
            elif level.level is Level.TENANT and item.reason is not None:
                assert tenant is not None and item.reason is Reason.QUOTA_EXCEEDED
                assert tenant.active_gpus + tenant.in_flight_gpus + request.gpu_count > tenant.gpu_quota
            elif level.level is Level.REGION and item.reason is not None:
                region = world.regions[item.name]
                facts = {
                    Reason.REGION_UNAVAILABLE: region.status is RegionStatus.UNAVAILABLE,
                    Reason.REGION_NOT_ALLOWED: tenant is not None
                    and tenant.allowed_regions is not None
                    and region.name not in tenant.allowed_regions,
                    Reason.JURISDICTION_MISMATCH: any(j != region.jurisdiction for j in required),
                    Reason.PRODUCT_NOT_OFFERED: not any(
                        p.shape == request.shape and request.wants_product(p.gpu_product)
                        for p in world.pools_in(region.name)
                    ),
                    Reason.NO_POOL_MATCHES: not filter_pools(world, request, region.name)[0],
                }
                assert facts[item.reason]
    if result.refusal is not None and result.refusal.code in (
        Reason.INSUFFICIENT_CAPACITY,
        Reason.NO_COMPATIBLE_BUNDLES,
    ):
        pool_level = result.explanation.level(Level.POOL)
        assert pool_level is not None and pool_level.items is not None
        matching = {item.name for item in pool_level.items if item.reason is None}
        nodes = [world.nodes[n] for pool in world.pools if pool.key in matching for n in pool.nodes]
        assert not any(fits(node, request) for node in nodes if node.name not in request.exclude_nodes)
        emptied = [
            replace(node, status=NodeStatus.READY, slots=tuple(replace(s, state=SlotState.FREE) for s in node.slots))
            for node in nodes
        ]
        could_fit = any(fits(node, request) for node in emptied)
        assert could_fit == (result.refusal.code is Reason.INSUFFICIENT_CAPACITY)


@SETTINGS
@given(cases())
def test_scheduling_is_deterministic_for_the_same_inputs_and_seed(case: tuple) -> None:
    world, request = case
    rebuilt = Snapshot(
        regions=list(world.regions.values()),
        pools=list(reversed(world.pools)),
        nodes=list(reversed(world.nodes.values())),
        tenants=list(world.tenants.values()),
    )
    assert schedule(world, request, detail=True) == schedule(rebuilt, request, detail=True)


@SETTINGS
@given(st.data())
def test_capacity_counts_what_sequential_node_plans_would_place(data: st.DataObject) -> None:
    node = NodeView(name="n", status=NodeStatus.READY, slots=data.draw(slots_of("n")), numa_nodes=2)
    gpus = data.draw(st.integers(1, 4))
    numa_policy = data.draw(st.sampled_from(list(NumaPolicy)))
    expected = allocations_on(profile_of(node), CapacityShape.GPU_SLICE, gpus, numa_policy)
    placed = 0
    while True:
        plan = plan_bundles(node, PlanRequest(allocation_id=f"x{placed}", gpu_count=gpus, numa_policy=numa_policy)).plan
        if plan is None:
            break
        taken = set(plan.slot_ids)
        node = replace(
            node,
            slots=tuple(
                replace(s, state=SlotState.CLAIMED, holder=f"x{placed}") if s.id in taken else s for s in node.slots
            ),
        )
        placed += 1
    assert placed == expected


@SETTINGS
@given(st.data())
def test_an_updated_snapshot_schedules_like_a_rebuilt_one(data: st.DataObject) -> None:
    world, request = data.draw(cases())
    names = data.draw(st.lists(st.sampled_from(sorted(world.nodes)), unique=True)) if world.nodes else []
    changed = [
        replace(world.nodes[name], status=data.draw(st.sampled_from(list(NodeStatus))), slots=data.draw(slots_of(name)))
        for name in names
    ]
    rebuilt = Snapshot(
        regions=list(world.regions.values()),
        pools=list(world.pools),
        nodes=[*(node for node in world.nodes.values() if node.name not in names), *changed],
        tenants=list(world.tenants.values()),
    )
    assert schedule(world.with_nodes(changed), request, detail=True) == schedule(rebuilt, request, detail=True)
