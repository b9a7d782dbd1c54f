"""Properties of the fleet scheduler over random fleets: it never overcommits a pool, it is deterministic whatever
the input order, an engine never spans pools, and a retained replica never moves."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.fleet_plan import FleetPlan
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica, stamped_member_cost
from scheduler.deployment import replica_manifest
from scheduler.deployment.pools import published_pools
from tests.scheduler.deployment.builders import (
    classes,
    cluster,
    deployment,
    engine,
    gpu,
    inference_class,
    member,
    plan,
    product_is,
    replica,
)

PRODUCTS = ("H100", "H200", "L40S")
KNOWN = classes(
    *(inference_class(f"{p.lower()}-x4", gpu(p, count=4)) for p in PRODUCTS),
    inference_class("mixed", gpu("L40S", count=2, name="small"), gpu("H100", count=8, name="big")),
)
CLASS_NAMES = sorted(KNOWN)
TARGET = "model"


PROBLEMS = {
    "not ready": {"ready": False},
    "no gateway": {"gateway": None},
    "NoSchedule": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
    "NoExecute": {"taints": [{"key": "gpu", "effect": "NoExecute"}]},
}


@st.composite
def clusters(draw: st.DrawFn) -> list[InferenceCluster]:
    result = []
    for number in range(draw(st.integers(1, 4))):
        pools = draw(st.lists(st.tuples(st.sampled_from(CLASS_NAMES), st.integers(-1, 8)), min_size=1, max_size=3))
        problem = draw(st.sampled_from(["none"] * 6 + sorted(PROBLEMS)))
        result.append(
            cluster(
                f"c{number}",
                [(f"p{i}", class_name, nodes) for i, (class_name, nodes) in enumerate(pools)],
                labels={"tier": draw(st.sampled_from(["prod", "prod", "dev"]))},
                **PROBLEMS.get(problem, {}),
            )
        )
    return result


@st.composite
def engines(draw: st.DrawFn) -> list[dict[str, Any]]:
    result = []
    for number in range(draw(st.integers(1, 2))):
        product = draw(st.sampled_from(PRODUCTS))
        count = draw(st.sampled_from([1, 1, 2, 4, 5]))
        copies = draw(st.integers(1, 2))
        if draw(st.booleans()):
            result.append(engine(f"e{number}", member("Standalone", product_is(product), count=count), copies=copies))
        else:
            leader = member("Leader", product_is(product), count=count) if draw(st.booleans()) else member("Leader")
            worker = member("Worker", product_is(product), count=count, workers=draw(st.integers(1, 2)))
            result.append(engine(f"e{number}", leader, worker, copies=copies))
    return result


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Any, list[InferenceCluster], list[ModelReplica]]:
    fleet = draw(clusters())
    shape = draw(engines())
    target = deployment(
        TARGET,
        *shape,
        replicas=draw(st.integers(1, 6)),
        match_labels=draw(st.sampled_from([None, {"tier": "prod"}])),
        tolerations=draw(st.sampled_from([[], [{"key": "gpu", "operator": "Exists"}]])),
    )
    cluster_names = [c.metadata.name for c in fleet] + ["gone"]
    existing = []
    for number in range(draw(st.integers(0, 6))):
        owner = draw(st.sampled_from([TARGET, TARGET, "other"]))
        placed_on = draw(st.sampled_from(cluster_names))
        pool = draw(st.sampled_from(["p0", "p1", "p2"]))
        placed_engines = [
            (e["name"], e["copies"], [(m["role"], pool, "nodeSelector" in m) for m in e["members"]]) for e in shape
        ]
        existing.append(
            replica(
                owner, placed_on, draw(st.integers(0, 2)), placed_engines, name=f"{owner}-r{number}", worker_nodes=2
            )
        )
    if draw(st.booleans()):  # replicas a previous pass placed, as the deployment workflow would feed them back
        earlier = deployment(TARGET, *shape, replicas=draw(st.integers(1, 6)))
        existing += [replica_manifest(earlier, r) for r in plan(earlier, fleet, KNOWN, existing).new]
    return target, fleet, existing


def charges(replicas: list[ModelReplica]) -> dict[tuple[str, str], int]:
    total: dict[tuple[str, str], int] = {}
    for r in replicas:
        for e in r.spec.engines:
            for m in e.members:
                key = (r.cluster or "", m.node_pool_name or "")
                total[key] = total.get(key, 0) + stamped_member_cost(m, e.copies)
    return total


def check_never_overcommits(result: FleetPlan, fleet: list[InferenceCluster], existing: list[ModelReplica]) -> None:
    kept = {r.name for r in result.retained}
    held = charges([r for r in existing if r.deployment != TARGET or r.metadata.name in kept])
    added: dict[tuple[str, str], int] = {}
    for r in result.new:
        for e in r.engines:
            added[(r.cluster, e.pool or "")] = added.get((r.cluster, e.pool or ""), 0) + e.nodes
    capacity = {(p.cluster, p.name): p.nodes for c in fleet for p in published_pools(c)}
    for key, nodes in added.items():
        assert held.get(key, 0) + nodes <= capacity[key], f"pool {key} overcommitted"


def check_engines_never_span_pools(result: FleetPlan) -> None:
    for r in result.new:
        for e in r.engines:
            assert {m.pool for m in e.members} == {e.pool}


def check_retained_never_move(result: FleetPlan, existing: list[ModelReplica]) -> None:
    by_name = {r.metadata.name: r for r in existing}
    for placed in result.retained:
        source = by_name[placed.name]
        assert (placed.cluster, placed.index) == (source.cluster, source.index)
        assert [[m.pool for m in e.members] for e in placed.engines] == [
            [m.node_pool_name for m in e.members] for e in source.spec.engines
        ]
    identities = [(r.cluster, r.index) for r in result.replicas]
    assert len(identities) == len(set(identities))
    assert len(result.replicas) <= result.status.desired


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_placement_never_overcommits_never_splits_an_engine_and_never_moves_a_kept_replica(
    scenario: tuple[Any, list[InferenceCluster], list[ModelReplica]],
) -> None:
    target, fleet, existing = scenario
    result = plan(target, fleet, KNOWN, existing)
    check_never_overcommits(result, fleet, existing)
    check_engines_never_span_pools(result)
    check_retained_never_move(result, existing)


@settings(max_examples=60, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_placement_is_deterministic_whatever_the_input_order(
    scenario: tuple[Any, list[InferenceCluster], list[ModelReplica]], shuffler: Any
) -> None:
    target, fleet, existing = scenario
    first = plan(target, fleet, KNOWN, existing)
    fleet, existing = list(fleet), list(existing)
    shuffler.shuffle(fleet)
    shuffler.shuffle(existing)
    assert plan(target, fleet, KNOWN, existing) == first
