"""The fleet scheduler's numbered rules (from docs/seeds.md, "Seed 000: Modelplane's fleet scheduler"), one table
or case per rule, as a user sees them: where replicas land, which are removed and why, and what the status says."""

from __future__ import annotations

import pytest

from contracts.fleet_plan import ClusterReason, DropReason, Phase, StatusReason
from contracts.manifest import Toleration
from fleet.inference_cluster import Taint
from scheduler.deployment.tolerations import tolerates
from tests.scheduler.deployment.builders import (
    classes,
    cluster,
    deployment,
    engine,
    gpu,
    inference_class,
    member,
    plan,
    pools_of,
    product_is,
    replica,
    standalone,
    where,
)

H100 = inference_class("h100-8x", gpu("H100"))
H200 = inference_class("h200-8x", gpu("H200", memory="141Gi"))
KNOWN = classes(H100, H200)
ON_H100 = product_is("H100")
ON_H200 = product_is("H200")


def one_gpu_deployment(replicas: int = 1, **options: object) -> object:
    return deployment("llama", standalone("serve", ON_H100), replicas=replicas, **options)


def kept_replica(cluster_name: str, index: int, pool: str = "h100", **options: object) -> object:
    return replica("llama", cluster_name, index, [("serve", 1, [("Standalone", pool, True)])], **options)


# Rule 1: a pure function; existing replicas are sorted by name before use.


def test_rule1_same_inputs_in_any_order_give_the_same_plan() -> None:
    clusters = [cluster(n, [("h100", "h100-8x", 2)]) for n in ("c", "a", "b")]
    replicas = [
        replica("other", "a", 0, [("serve", 1, [("Standalone", "h100", True)])]),
        kept_replica("b", 0),
        kept_replica("b", 0, name="llama-b-0-copy"),
    ]
    target = one_gpu_deployment(replicas=4)
    first = plan(target, clusters, KNOWN, replicas)
    second = plan(target, list(reversed(clusters)), KNOWN, list(reversed(replicas)))
    assert first == second
    assert [d.name for d in first.dropped] == ["llama-b-0-copy"]


# Rule 2: retain.


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("cluster deleted", DropReason.CLUSTER_GONE),
        ("cluster relabelled", DropReason.CLUSTER_NOT_SELECTED),
        ("NoExecute taint", DropReason.NO_EXECUTE_TAINT),
        ("engine renamed", DropReason.ENGINES_CHANGED),
        ("role changed", DropReason.ENGINES_CHANGED),
        ("pool deleted", DropReason.POOL_GONE),
        ("nodeSelector edited", DropReason.POOL_NO_LONGER_MATCHES),
    ],
)
def test_rule2_a_replica_is_replaced_when(change: str, reason: DropReason) -> None:
    selector = {"tier": "prod"}
    old = cluster("a", [("h100", "h100-8x", 4), ("h200", "h200-8x", 4)], labels=selector)
    fresh = cluster("b", [("h100", "h100-8x", 4), ("h200", "h200-8x", 4)], labels=selector)
    existing = kept_replica("a", 0)
    target = deployment("llama", standalone("serve", ON_H100), match_labels=selector)
    if change == "cluster deleted":
        old = None
    elif change == "cluster relabelled":
        old = cluster("a", [("h100", "h100-8x", 4)], labels={"tier": "dev"})
    elif change == "NoExecute taint":
        old = cluster("a", [("h100", "h100-8x", 4)], labels=selector, taints=[{"key": "drain", "effect": "NoExecute"}])
    elif change == "engine renamed":
        target = deployment("llama", standalone("generate", ON_H100), match_labels=selector)
    elif change == "role changed":
        gang = engine("serve", member("Leader", ON_H100), member("Worker", ON_H100, workers=1))
        target = deployment("llama", gang, match_labels=selector)
    elif change == "pool deleted":
        old = cluster("a", [("h200", "h200-8x", 4)], labels=selector)
    elif change == "nodeSelector edited":
        target = deployment("llama", standalone("serve", ON_H200), match_labels=selector)

    result = plan(target, [c for c in (old, fresh) if c is not None], KNOWN, [existing])

    assert [(d.name, d.reason) for d in result.dropped] == [("llama-a-0", reason)]
    assert [r.origin for r in result.replicas] == ["new"]


@pytest.mark.parametrize(
    "state",
    [
        {"ready": False},
        {"gateway": None},
        {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]},
        {"taints": [{"key": "drain", "effect": "NoExecute"}], "tolerated": True},
        {"pool_nodes": 0},
    ],
)
def test_rule2_a_replica_stays_on_a_degraded_full_or_tainted_cluster(state: dict[str, object]) -> None:
    home = cluster(
        "a",
        [("h100", "h100-8x", state.get("pool_nodes", 4))],
        ready=state.get("ready", True),
        gateway=state.get("gateway", "10.0.0.1"),
        taints=state.get("taints", ()),
    )
    tolerations = [{"key": "drain", "operator": "Exists"}] if state.get("tolerated") else []
    target = one_gpu_deployment(tolerations=tolerations)
    result = plan(target, [home, cluster("b", [("h100", "h100-8x", 4)])], KNOWN, [kept_replica("a", 0)])
    assert where(result) == [("a", 0, "retained")]
    assert result.dropped == []


def test_rule2_of_two_replicas_claiming_one_cluster_and_index_the_first_by_name_stays() -> None:
    first = kept_replica("a", 0, name="llama-a")
    second = kept_replica("a", 0, name="llama-b")
    result = plan(one_gpu_deployment(replicas=2), [cluster("a", [("h100", "h100-8x", 4)])], KNOWN, [second, first])
    assert [(r.name, r.origin) for r in result.replicas] == [("llama-a", "retained"), ("llama-a-1", "new")]
    assert [(d.name, d.reason) for d in result.dropped] == [("llama-b", DropReason.DUPLICATE_INDEX)]


def test_rule2_a_retained_replica_never_moves_even_when_a_cluster_frees_up() -> None:
    crowded = cluster("a", [("h100", "h100-8x", 1)])
    empty = cluster("b", [("h100", "h100-8x", 8)])
    result = plan(one_gpu_deployment(), [crowded, empty], KNOWN, [kept_replica("a", 0)])
    assert where(result) == [("a", 0, "retained")]


# Rule 3: scale down the most loaded cluster first, then the later cluster name, then the highest index.


def test_rule3_scale_down_drops_from_the_most_loaded_cluster_then_the_later_name_then_the_highest_index() -> None:
    clusters = [cluster(n, [("h100", "h100-8x", 8)]) for n in ("a", "b", "c")]
    existing = [kept_replica("a", 0), kept_replica("a", 1), kept_replica("b", 0), kept_replica("c", 0)]
    result = plan(one_gpu_deployment(replicas=2), clusters, KNOWN, existing)
    assert [d.name for d in result.dropped] == ["llama-a-1", "llama-c-0"]
    assert {d.reason for d in result.dropped} == {DropReason.SCALED_DOWN}
    assert where(result) == [("a", 0, "retained"), ("b", 0, "retained")]


# docs/seeds.md, "Scale-down by health" (`scaleDownOrder: Health`): replicas in error first, then starting, then
# ready; among equals Modelplane's rule 3. Health is read from the status conditions a Crossplane composite
# publishes.
READY = [
    {"type": "Synced", "status": "True", "reason": "ReconcileSuccess"},
    {"type": "Ready", "status": "True", "reason": "Available"},
]
STARTING = [
    {"type": "Synced", "status": "True", "reason": "ReconcileSuccess"},
    {"type": "Ready", "status": "False", "reason": "Creating"},
]
ERROR = [
    {"type": "Synced", "status": "False", "reason": "ReconcileError"},
    {"type": "Ready", "status": "False", "reason": "Creating"},
]


def test_scale_down_by_health_removes_replicas_in_error_then_starting_then_ready() -> None:
    clusters = [cluster(n, [("h100", "h100-8x", 8)]) for n in ("a", "b", "c")]
    existing = [
        kept_replica("a", 0, conditions=READY),
        kept_replica("a", 1, conditions=READY),
        kept_replica("b", 0, conditions=STARTING),
        kept_replica("c", 0, conditions=ERROR),
    ]
    by_health = plan(one_gpu_deployment(replicas=2, scale_down_order="Health"), clusters, KNOWN, existing)
    assert [(d.name, d.message) for d in by_health.dropped] == [
        ("llama-c-0", "scaled down to 2 replicas (error replicas first)"),
        ("llama-b-0", "scaled down to 2 replicas (starting replicas first)"),
    ]
    assert where(by_health) == [("a", 0, "retained"), ("a", 1, "retained")]
    # Modelplane's order (the default) removes the most loaded cluster's highest index first, whatever the health.
    default = plan(one_gpu_deployment(replicas=2), clusters, KNOWN, existing)
    assert [d.name for d in default.dropped] == ["llama-a-1", "llama-c-0"]


def test_scale_down_by_health_among_equals_follows_modelplanes_order() -> None:
    clusters = [cluster(n, [("h100", "h100-8x", 8)]) for n in ("a", "b")]
    existing = [
        kept_replica("a", 0, conditions=STARTING),
        kept_replica("a", 1, conditions=STARTING),
        kept_replica("b", 0, conditions=STARTING),
        kept_replica("b", 1, conditions=[]),  # a status without conditions yet: starting
        kept_replica("b", 2, conditions=READY),
    ]
    result = plan(one_gpu_deployment(replicas=3, scale_down_order="Health"), clusters, KNOWN, existing)
    # b holds three: its starting one of highest index goes first, then a and b hold two each: the later name, b
    assert [d.name for d in result.dropped] == ["llama-b-1", "llama-b-0"]


def test_an_unknown_scale_down_order_is_refused() -> None:
    with pytest.raises(ValueError, match="scaleDownOrder"):
        one_gpu_deployment(scale_down_order="Newest")


# Rule 4: the ledger.


def test_rule4_other_deployments_hold_their_stamped_nodes() -> None:
    other = replica("embed", "a", 0, [("serve", 3, [("Standalone", "h100", True)])])
    result = plan(one_gpu_deployment(replicas=2), [cluster("a", [("h100", "h100-8x", 4)])], KNOWN, [other])
    assert where(result) == [("a", 0, "new")]
    assert result.status.clusters[0].reason is ClusterReason.INSUFFICIENT_NODES


def test_rule4_a_member_without_device_requests_holds_no_node() -> None:
    claimless = replica("embed", "a", 0, [("serve", 3, [("Standalone", "h100", False)])])
    result = plan(one_gpu_deployment(replicas=4), [cluster("a", [("h100", "h100-8x", 4)])], KNOWN, [claimless])
    assert result.status.new == 4


@pytest.mark.parametrize("count", [-3, 0])
def test_rule4_a_zero_or_negative_node_count_counts_as_none(count: int) -> None:
    result = plan(one_gpu_deployment(), [cluster("a", [("h100", "h100-8x", count)])], KNOWN)
    assert result.replicas == []
    assert result.status.message == "0 of 1 replicas scheduled (checked 1 clusters)"


def test_rule4_an_omitted_node_count_is_the_xrds_default_of_one() -> None:
    result = plan(one_gpu_deployment(replicas=2), [cluster("a", [("h100", "h100-8x", None)])], KNOWN)
    assert [(r.cluster, r.index) for r in result.replicas] == [("a", 0)]
    assert result.status.message == "1 of 2 replicas scheduled (checked 1 clusters)"


def test_rule4_a_retained_replica_keeps_its_old_cost_when_the_spec_grows() -> None:
    # Stamped with 1 copy (1 node); the spec now asks for 3 copies. 4 nodes: 1 held + 3 for the new replica.
    grown = deployment("llama", standalone("serve", ON_H100, copies=3), replicas=2)
    result = plan(grown, [cluster("a", [("h100", "h100-8x", 4)])], KNOWN, [kept_replica("a", 0)])
    assert where(result) == [("a", 0, "retained"), ("a", 1, "new")]
    assert [r.engines[0].nodes for r in result.replicas] == [1, 3]


def test_rule4_nodes_of_a_dropped_replica_are_free_for_its_replacement() -> None:
    # The only pool is full with our replica, whose engine was renamed: it is dropped and re-placed there.
    renamed = deployment("llama", standalone("generate", ON_H100))
    result = plan(renamed, [cluster("a", [("h100", "h100-8x", 1)])], KNOWN, [kept_replica("a", 0)])
    assert where(result) == [("a", 0, "new")]


def test_rule4_pools_of_other_deployments_replicas_on_pools_that_are_gone_are_not_charged() -> None:
    ghost = replica("embed", "a", 0, [("serve", 8, [("Standalone", "deleted-pool", True)])])
    result = plan(one_gpu_deployment(), [cluster("a", [("h100", "h100-8x", 1)])], KNOWN, [ghost])
    assert where(result) == [("a", 0, "new")]


# Rule 5: fill.


def test_rule5_spreads_before_packing_with_ties_broken_by_name() -> None:
    clusters = [cluster(n, [("h100", "h100-8x", 8)]) for n in ("c", "b", "a")]
    result = plan(one_gpu_deployment(replicas=5), clusters, KNOWN)
    assert where(result) == [("a", 0, "new"), ("a", 1, "new"), ("b", 0, "new"), ("b", 1, "new"), ("c", 0, "new")]


def test_rule5_counts_retained_replicas_when_spreading_and_takes_the_lowest_free_index() -> None:
    clusters = [cluster(n, [("h100", "h100-8x", 8)]) for n in ("a", "b")]
    existing = [kept_replica("a", 0), kept_replica("a", 2)]
    result = plan(one_gpu_deployment(replicas=5), clusters, KNOWN, existing)
    assert where(result) == [
        ("a", 0, "retained"),
        ("a", 2, "retained"),
        ("a", 1, "new"),
        ("b", 0, "new"),
        ("b", 1, "new"),
    ]


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"ready": False}, ClusterReason.NOT_READY),
        ({"status": False}, ClusterReason.NOT_READY),
        ({"gateway": None}, ClusterReason.NO_GATEWAY_ADDRESS),
        ({"taints": [{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}]}, ClusterReason.UNTOLERATED_TAINT),
        ({"taints": [{"key": "drain", "effect": "NoExecute"}]}, ClusterReason.UNTOLERATED_TAINT),
    ],
)
def test_rule5_new_replicas_need_a_ready_cluster_with_a_gateway_and_no_untolerated_taint(
    options: dict[str, object], reason: ClusterReason
) -> None:
    result = plan(one_gpu_deployment(), [cluster("a", [("h100", "h100-8x", 4)], **options)], KNOWN)
    assert result.replicas == []
    assert [(c.cluster, c.reason) for c in result.status.clusters] == [("a", reason)]


def test_rule5_prefer_no_schedule_does_not_block() -> None:
    soft = cluster("a", [("h100", "h100-8x", 4)], taints=[{"key": "spot", "effect": "PreferNoSchedule"}])
    assert where(plan(one_gpu_deployment(), [soft], KNOWN)) == [("a", 0, "new")]


def test_rule5_only_clusters_matching_the_selector_are_considered() -> None:
    clusters = [
        cluster("a", [("h100", "h100-8x", 4)], labels={"tier": "dev"}),
        cluster("b", [("h100", "h100-8x", 4)], labels={"tier": "prod", "region": "eu"}),
    ]
    result = plan(one_gpu_deployment(replicas=2, match_labels={"tier": "prod"}), clusters, KNOWN)
    assert where(result) == [("b", 0, "new"), ("b", 1, "new")]


def test_rule5_stops_when_nothing_fits_and_the_result_is_partial_not_an_error() -> None:
    result = plan(one_gpu_deployment(replicas=3), [cluster("a", [("h100", "h100-8x", 2)])], KNOWN)
    assert len(result.replicas) == 2
    assert result.status.phase is Phase.PARTIALLY_SCHEDULED
    assert result.status.message == "2 of 3 replicas scheduled (checked 1 clusters)"


# Rule 6: engines.


def test_rule6_each_engine_takes_the_first_pool_in_published_order_with_room() -> None:
    pools = [("small", "h100-8x", 1), ("big", "h100-8x", 4), ("other", "h200-8x", 4)]
    result = plan(one_gpu_deployment(replicas=3), [cluster("a", pools)], KNOWN)
    assert [p for (_, _), p in sorted(pools_of(result).items())] == [["small"], ["big"], ["big"]]


def test_rule6_engines_of_one_replica_may_use_different_pools_of_one_cluster() -> None:
    target = deployment("pd", standalone("prefill", ON_H200), standalone("decode", ON_H100))
    result = plan(target, [cluster("a", [("h100", "h100-8x", 1), ("h200", "h200-8x", 1)])], KNOWN)
    assert pools_of(result) == {("a", 0): ["h200", "h100"]}


def test_rule6_an_engine_is_never_split_across_pools() -> None:
    split = engine("serve", member("Leader", ON_H100), member("Worker", ON_H200, workers=1))
    result = plan(deployment("gang", split), [cluster("a", [("h100", "h100-8x", 8), ("h200", "h200-8x", 8)])], KNOWN)
    assert result.replicas == []
    assert result.status.clusters[0].reason is ClusterReason.NO_MATCHING_POOL


def test_rule6_node_cost_is_pods_times_copies_and_a_member_without_node_selector_rides_along() -> None:
    # Leader without a nodeSelector: 0 nodes. Worker over 3 nodes, 2 copies: 6 nodes.
    gang = engine("serve", member("Leader"), member("Worker", ON_H100, workers=3), copies=2)
    fits = plan(deployment("gang", gang), [cluster("a", [("h100", "h100-8x", 6)])], KNOWN)
    assert [(m.role, m.nodes) for m in fits.replicas[0].engines[0].members] == [("Leader", 0), ("Worker", 6)]
    assert fits.replicas[0].engines[0].nodes == 6
    short = plan(deployment("gang", gang), [cluster("a", [("h100", "h100-8x", 5)])], KNOWN)
    assert short.replicas == []
    assert "needs 6 free nodes, has 5" in short.status.clusters[0].message


def test_rule6_a_later_engine_sees_the_nodes_an_earlier_engine_took_on_the_same_pool() -> None:
    target = deployment("pd", standalone("prefill", ON_H100), standalone("decode", ON_H100))
    one = plan(target, [cluster("a", [("h100", "h100-8x", 1)])], KNOWN)
    assert one.replicas == []
    two = plan(target, [cluster("a", [("h100", "h100-8x", 1), ("more", "h100-8x", 1)])], KNOWN)
    assert pools_of(two) == {("a", 0): ["h100", "more"]}


# Rule 7: device matching per member.

MIXED = inference_class(
    "mixed",
    gpu("H100", count=8, name="gpu-a"),
    gpu("H100", count=8, name="gpu-b"),
    gpu("NIC", count=4, name="nic", claim="Synthetic"),
    gpu("H100", count=0, name="empty"),
)


def two_requests(first: int, second: int, product: str = "H100") -> dict[str, object]:
    requests = [
        {"name": "one", "count": first, "selectors": [{"cel": product_is(product)}]},
        {"name": "two", "count": second, "selectors": [{"cel": product_is(product)}]},
    ]
    return standalone_with(requests)


def standalone_with(requests: list[dict[str, object]]) -> dict[str, object]:
    return engine("serve", member("Standalone", requests=requests))


@pytest.mark.parametrize(
    ("requests", "claimed"),
    [
        (two_requests(5, 5), [("one", "gpu-a", 5), ("two", "gpu-b", 5)]),  # counts shared: 5+5 > 8 on gpu-a
        (two_requests(4, 4), [("one", "gpu-a", 4), ("two", "gpu-a", 4)]),
        (two_requests(8, 9), None),  # no device has 9
        (
            standalone_with(
                [
                    {"name": "gpu", "count": 2, "selectors": [{"cel": product_is("H100")}]},
                    {"name": "nic", "count": 1, "selectors": [{"cel": product_is("NIC")}]},
                ]
            ),
            [("gpu", "gpu-a", 2)],  # the Synthetic NIC matches but is not claimed
        ),
    ],
)
def test_rule7_requests_take_the_first_device_with_count_left(
    requests: dict[str, object], claimed: list[tuple[str, str, int]] | None
) -> None:
    result = plan(deployment("m", requests), [cluster("a", [("p", "mixed", 4)])], classes(MIXED))
    if claimed is None:
        assert result.replicas == []
        assert result.status.clusters[0].reason is ClusterReason.NO_MATCHING_POOL
    else:
        member_placement = result.replicas[0].engines[0].members[0]
        assert [(r.name, r.device, r.count) for r in member_placement.device_requests] == claimed


def test_rule7_a_device_of_count_zero_matches_nothing() -> None:
    only_empty = inference_class("empty-only", gpu("H100", count=0))
    result = plan(one_gpu_deployment(), [cluster("a", [("p", "empty-only", 4)])], classes(only_empty))
    assert result.replicas == []


def test_rule7_an_engine_that_only_matches_synthetic_devices_is_not_placed() -> None:
    result = plan(
        deployment("nic", standalone("serve", product_is("NIC"))), [cluster("a", [("p", "mixed", 4)])], classes(MIXED)
    )
    assert result.replicas == []
    assert "no member claims a DRA device" in result.status.clusters[0].message


def test_rule7_a_selector_that_fails_on_a_device_does_not_match_it_and_the_reason_quotes_the_error() -> None:
    missing = 'device.attributes["gpu.nvidia.com"].vendor == "nvidia"'
    result = plan(deployment("m", standalone("serve", missing)), [cluster("a", [("h100", "h100-8x", 4)])], KNOWN)
    assert result.replicas == []
    assert "vendor" in result.status.clusters[0].message and "failed" in result.status.clusters[0].message


# Rule 8: tolerations.


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        ({"key": "gpu", "value": "a100"}, {"key": "gpu", "value": "a100", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "a100"}, {"key": "gpu", "value": "h100", "effect": "NoSchedule"}, False),
        ({"key": "gpu", "operator": "Exists"}, {"key": "gpu", "value": "h100", "effect": "NoExecute"}, True),
        ({"key": "team", "operator": "Exists"}, {"key": "gpu", "value": "h100", "effect": "NoSchedule"}, False),
        ({"operator": "Exists"}, {"key": "anything", "value": "x", "effect": "NoExecute"}, True),
        ({"operator": "Exists", "effect": "NoSchedule"}, {"key": "drain", "effect": "NoExecute"}, False),
        (
            {"key": "drain", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "drain", "effect": "NoExecute"},
            False,
        ),
        ({"key": "drain", "operator": "Exists", "effect": "NoExecute"}, {"key": "drain", "effect": "NoExecute"}, True),
    ],
)
def test_rule8_toleration_matching(toleration: dict[str, str], taint: dict[str, str], tolerated: bool) -> None:
    assert tolerates(Toleration.model_validate(toleration), Taint.model_validate(taint)) is tolerated


def test_rule8_a_tolerated_taint_admits_new_replicas() -> None:
    reserved = cluster("a", [("h100", "h100-8x", 4)], taints=[{"key": "team", "value": "ml", "effect": "NoSchedule"}])
    target = one_gpu_deployment(tolerations=[{"key": "team", "operator": "Equal", "value": "ml"}])
    assert where(plan(target, [reserved], KNOWN)) == [("a", 0, "new")]


# Rule 9: status and reasons.


def test_rule9_invalid_node_selector_names_the_expression_and_position_and_changes_nothing() -> None:
    broken = deployment("llama", standalone("serve", 'device.attributes["gpu.nvidia.com"].productName == '))
    result = plan(broken, [cluster("a", [("h100", "h100-8x", 4)])], KNOWN, [kept_replica("a", 0)])
    assert result.status.reason is StatusReason.INVALID_NODE_SELECTOR
    assert result.status.phase is Phase.SCHEDULE_FAILED
    problem = result.status.selector_error
    assert problem is not None and problem.expression.endswith("productName == ")
    assert (problem.line, problem.column) >= (1, 1)
    assert f"line {problem.line}, column {problem.column}" in result.status.message
    assert where(result) == [("a", 0, "retained")] and result.dropped == []


def test_rule9_no_clusters_when_nothing_matches_the_cluster_selector() -> None:
    result = plan(one_gpu_deployment(match_labels={"tier": "prod"}), [cluster("a", [("h100", "h100-8x", 4)])], KNOWN)
    assert (result.status.reason, result.status.phase) == (StatusReason.NO_CLUSTERS, Phase.SCHEDULE_FAILED)
    assert result.status.clusters_checked == 0


def test_rule9_insufficient_capacity_says_how_many_and_why_for_each_cluster() -> None:
    clusters = [
        cluster("a", [("h200", "h200-8x", 4)]),
        cluster("b", [("h100", "h100-8x", 0)]),
        cluster("c", [("h100", "h100-8x", 4)], ready=False),
    ]
    result = plan(one_gpu_deployment(replicas=2), clusters, KNOWN)
    status = result.status
    assert (status.reason, status.phase) == (StatusReason.INSUFFICIENT_CAPACITY, Phase.SCHEDULE_FAILED)
    assert status.message == "0 of 2 replicas scheduled (checked 3 clusters)"
    assert (status.desired, status.available) == (2, 0)
    assert [(c.cluster, c.reason) for c in status.clusters] == [
        ("a", ClusterReason.NO_MATCHING_POOL),
        ("b", ClusterReason.INSUFFICIENT_NODES),
        ("c", ClusterReason.NOT_READY),
    ]
    assert "pool h200" in status.clusters[0].message and "H100" not in status.clusters[0].message


@pytest.mark.parametrize(
    ("capacity", "min_replicas", "phase"),
    [
        (5, 2, Phase.FULLY_SCHEDULED),
        (3, 2, Phase.PARTIALLY_SCHEDULED),
        (2, 2, Phase.PARTIALLY_SCHEDULED),
        (1, 2, Phase.SCHEDULE_FAILED),
        (1, None, Phase.PARTIALLY_SCHEDULED),
        (0, None, Phase.SCHEDULE_FAILED),
    ],
)
def test_rule9_min_replicas_decides_between_partially_scheduled_and_schedule_failed(
    capacity: int, min_replicas: int | None, phase: Phase
) -> None:
    target = one_gpu_deployment(replicas=5, min_replicas=min_replicas)
    result = plan(target, [cluster("a", [("h100", "h100-8x", capacity)])], KNOWN)
    # Below minReplicas nothing new is placed (docs/seeds.md, "Partial scheduling above minReplicas").
    below_min = min_replicas is not None and capacity < min_replicas
    assert (result.status.available, result.status.phase) == (0 if below_min else capacity, phase)
    assert (result.status.reason is None) == (phase is Phase.FULLY_SCHEDULED)
