"""Seeds 001 (GPUStack resource fit, binpack and spread), 002 (Seldon capabilities, stickiness, partial scheduling)
and 003 (KAITO node groups from GPU Feature Discovery labels) on the fleet scheduler's inputs; docs/seeds.md has a
section for each rule."""

from __future__ import annotations

import pytest

from contracts.fleet_plan import ClusterReason, Phase
from fleet.inference_cluster import InferenceCluster
from fleet.nodelist import pools_from_node_list
from scheduler.deployment import replica_manifest
from tests.scheduler.deployment.builders import (
    API,
    classes,
    cluster,
    deployment,
    engine,
    gpu,
    inference_class,
    member,
    memory_at_least,
    plan,
    pools_of,
    product_is,
    standalone,
    where,
)

H100 = inference_class("h100-8x", gpu("H100", memory="80Gi"), capabilities=["vllm"])
H200 = inference_class("h200-8x", gpu("H200", memory="141Gi"), capabilities=["vllm", "sglang"])
L4_WITH_HOST = inference_class(
    "l4-host",
    gpu("L4", count=1, memory="24Gi"),
    {"name": "host", "claim": "Synthetic", "driver": "cpu.berth.dev", "capacity": {"memory": {"value": "512Gi"}}},
    capabilities=["voxbox", "custom"],
)
KNOWN = classes(H100, H200, L4_WITH_HOST)


def memory_model(need: str, backend: str | None = None, **options: object) -> object:
    resources = {"gpuMemory": need, **({"backend": backend} if backend else {})}
    return deployment("model", engine("serve", member("Standalone", resources=resources)), **options)


def served(result: object) -> object:
    return result.replicas[0].engines[0].members[0]


# docs/seeds.md, "Resource fit from a memory need", step by step; "Binpack and spread".


@pytest.mark.parametrize(
    ("need", "backend", "pool", "step", "count", "span", "nodes"),
    [
        ("60Gi", None, "h100", "OneGpu", 1, None, 1),
        ("200Gi", None, "h100", "GpusOfOneNode", 3, None, 1),
        ("640Gi", None, "h100", "GpusOfOneNode", 8, None, 1),
        ("1000Gi", "vllm", "h100", "SeveralNodes", 8, 2, 2),
        ("2000Gi", "sglang", "h200", "SeveralNodes", 8, 2, 2),
    ],
)
def test_seed001_the_request_is_derived_in_order_one_gpu_one_node_several_nodes(
    need: str, backend: str | None, pool: str, step: str, count: int, span: int | None, nodes: int
) -> None:
    pools = [("h100", "h100-8x", 4)] if pool == "h100" else [("h200", "h200-8x", 4)]
    result = plan(memory_model(need, backend), [cluster("a", pools)], KNOWN)
    placed = served(result)
    assert (placed.pool, placed.fit, placed.span, placed.nodes) == (pool, step, span, nodes)
    assert [(r.device, r.count) for r in placed.device_requests] == [("gpu", count)]


def test_seed001_a_pool_reached_at_an_earlier_step_is_preferred_over_an_earlier_pool() -> None:
    # 100Gi: h100 (published first) needs two GPUs, h200 holds it on one.
    result = plan(memory_model("100Gi"), [cluster("a", [("h100", "h100-8x", 4), ("h200", "h200-8x", 4)])], KNOWN)
    assert (served(result).pool, served(result).fit) == ("h200", "OneGpu")


def test_seed001_several_nodes_are_only_for_backends_that_serve_across_nodes_and_the_refusal_names_each_step() -> None:
    any_backend = inference_class("h100-any", gpu("H100", memory="80Gi"), capabilities=["vllm", "custom"])
    result = plan(memory_model("1000Gi", "custom"), [cluster("a", [("h100", "h100-any", 8)])], classes(any_backend))
    assert result.replicas == []
    verdict = result.status.clusters[0]
    assert verdict.reason is ClusterReason.NO_MATCHING_POOL
    for clause in (
        "needs 1000Gi of GPU memory",
        "one GPU: the largest holds 80Gi",
        "GPUs of one node: 8 x 80Gi",
        "several nodes: backend 'custom' does not serve across nodes",
        "CPU: no host memory published",
    ):
        assert clause in verdict.message


def test_seed001_cpu_is_the_last_resort_for_backends_that_run_there() -> None:
    result = plan(memory_model("100Gi", "voxbox"), [cluster("a", [("l4", "l4-host", 2)])], KNOWN)
    placed = served(result)
    assert (placed.fit, placed.nodes, [r.device for r in placed.device_requests]) == ("Cpu", 1, ["host"])
    refused = plan(memory_model("100Gi", "vllm"), [cluster("a", [("l4", "l4-host", 2)])], KNOWN)
    assert "lacks capability vllm" in refused.status.clusters[0].message


def test_seed001_a_multi_node_fit_needs_that_many_free_nodes_and_is_stamped_on_the_replica() -> None:
    need = memory_model("1000Gi", "vllm")
    assert plan(need, [cluster("a", [("h100", "h100-8x", 1)])], KNOWN).replicas == []
    result = plan(need, [cluster("a", [("h100", "h100-8x", 2)])], KNOWN)
    manifest = replica_manifest(need, result.replicas[0])
    stamped = manifest.spec.engines[0].members[0]
    assert (stamped.node_pool_name, stamped.nodes, stamped.device_requests[0].count) == ("h100", 2, 8)


@pytest.mark.parametrize(("strategy", "pool"), [(None, "first"), ("binpack", "fuller"), ("spread", "emptier")])
def test_seed001_placement_strategy_chooses_among_fitting_pools(strategy: str | None, pool: str) -> None:
    pools = [("first", "h100-8x", 6), ("fuller", "h100-8x", 2), ("emptier", "h100-8x", 9)]
    result = plan(memory_model("60Gi", strategy=strategy), [cluster("a", pools)], KNOWN)
    assert served(result).pool == pool


def test_seed001_placement_strategy_also_applies_to_device_requests() -> None:
    pools = [("first", "h100-8x", 6), ("fuller", "h100-8x", 2)]
    target = deployment("d", standalone("serve", product_is("H100")), strategy="binpack")
    assert pools_of(plan(target, [cluster("a", pools)], KNOWN)) == {("a", 0): ["fuller"]}


# docs/seeds.md: "Capabilities a pool must offer", "Existing replicas keep their place", "Partial scheduling above
# minReplicas".


def test_seed002_a_pool_lacking_a_required_capability_is_not_eligible() -> None:
    pools = [("h100", "h100-8x", 4), ("h200", "h200-8x", 4)]
    target = deployment("d", standalone("serve", memory_at_least("40Gi")), requirements=["sglang"])
    assert pools_of(plan(target, [cluster("a", pools)], KNOWN)) == {("a", 0): ["h200"]}
    refused = plan(target, [cluster("b", [("h100", "h100-8x", 4)])], KNOWN)
    assert "class h100-8x lacks capability sglang (offers vllm)" in refused.status.clusters[0].message


def test_seed002_a_backend_must_be_a_capability_of_the_pool() -> None:
    result = plan(
        memory_model("60Gi", "sglang"), [cluster("a", [("h100", "h100-8x", 4), ("h200", "h200-8x", 4)])], KNOWN
    )
    assert served(result).pool == "h200"


def test_seed002_the_cluster_already_hosting_the_model_is_kept_no_flip_flop() -> None:
    target = deployment("d", standalone("serve", product_is("H100")), replicas=2)
    first = plan(target, [cluster("a", [("h100", "h100-8x", 4)])], KNOWN)
    manifests = [replica_manifest(target, r) for r in first.replicas]
    # A larger, emptier cluster appears: nothing moves and nothing is added.
    again = plan(
        target, [cluster("a", [("h100", "h100-8x", 4)]), cluster("0-new", [("h100", "h100-8x", 64)])], KNOWN, manifests
    )
    assert where(again) == [("a", 0, "retained"), ("a", 1, "retained")]
    assert again.dropped == []


def test_seed002_partial_scheduling_above_min_replicas() -> None:
    target = deployment("d", standalone("serve", product_is("H100")), replicas=4, min_replicas=2)
    partial = plan(target, [cluster("a", [("h100", "h100-8x", 3)])], KNOWN)
    assert (partial.status.phase, partial.status.desired, partial.status.available) == (Phase.PARTIALLY_SCHEDULED, 4, 3)
    failed = plan(target, [cluster("a", [("h100", "h100-8x", 1)])], KNOWN)
    assert failed.status.phase is Phase.SCHEDULE_FAILED


# docs/seeds.md, "Node groups from GPU Feature Discovery labels".


def node(name: str, **labels: str) -> dict[str, object]:
    gfd = {f"nvidia.com/gpu.{k}": v for k, v in labels.items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **gfd}},
    }


A100_80 = {"product": "NVIDIA-A100-SXM4-80GB", "count": "8", "memory": "81920"}
A100_40 = {"product": "NVIDIA-A100-SXM4-40GB", "count": "4", "memory": "40960"}
KUBECTL_OUTPUT = {
    "apiVersion": "v1",
    "kind": "List",
    "metadata": {"resourceVersion": ""},
    "items": [
        node("gpu-b", **A100_80),
        node("gpu-a", **A100_80),
        node("gpu-c", **A100_40),
        node("control-plane"),
        node("half-labelled", product="NVIDIA-L4", count="1"),
        node("odd", product="NVIDIA-L4", count="one", memory="23034"),
    ],
}


def test_seed003_nodes_are_grouped_by_product_count_and_memory_into_homogeneous_pools() -> None:
    derived = pools_from_node_list(KUBECTL_OUTPUT)
    assert [(p.name, p.class_name, p.node_count) for p in derived.pools] == [
        ("nvidia-a100-sxm4-40gb-4x40960mi", "nvidia-a100-sxm4-40gb-4x40960mi", 1),
        ("nvidia-a100-sxm4-80gb-8x81920mi", "nvidia-a100-sxm4-80gb-8x81920mi", 2),
    ]
    assert derived.groups[1].nodes == ("gpu-a", "gpu-b")
    device = derived.classes(API)[1].spec.devices[0]
    assert (device.count, device.attributes["productName"].string, device.capacity["memory"].value) == (
        8,
        "NVIDIA-A100-SXM4-80GB",
        "81920Mi",
    )


def test_seed003_a_node_missing_a_label_is_reported_not_guessed() -> None:
    skipped = {s.name: s.reason for s in pools_from_node_list(KUBECTL_OUTPUT).skipped}
    assert set(skipped) == {"control-plane", "half-labelled", "odd"}
    assert "nvidia.com/gpu.product, nvidia.com/gpu.count, nvidia.com/gpu.memory" in skipped["control-plane"]
    assert skipped["half-labelled"] == "missing GPU Feature Discovery label nvidia.com/gpu.memory"
    assert "nvidia.com/gpu.count='one'" in skipped["odd"]


def test_seed003_derived_pools_are_scheduled_like_any_other_with_selectors_and_the_resource_fit() -> None:
    derived = pools_from_node_list({"kind": "NodeList", "items": KUBECTL_OUTPUT["items"]})
    byo = InferenceCluster.model_validate(
        {
            "apiVersion": API,
            "kind": "InferenceCluster",
            "metadata": {"name": "byo"},
            "spec": {"nodePools": [p.model_dump(by_alias=True, exclude_none=True) for p in derived.pools]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "gateway": {"address": "10.1.0.1"}},
        }
    )
    known = classes(*derived.classes(API))
    by_selector = deployment("sel", standalone("serve", memory_at_least("80Gi"), count=8), replicas=3)
    assert [p for p in pools_of(plan(by_selector, [byo], known)).values()] == [["nvidia-a100-sxm4-80gb-8x81920mi"]] * 2
    by_memory = plan(memory_model("200Gi"), [byo], known)  # 4 x 40Gi is too little; 3 x 80Gi of one node holds it
    assert (served(by_memory).pool, served(by_memory).fit) == ("nvidia-a100-sxm4-80gb-8x81920mi", "GpusOfOneNode")


def test_seed003_anything_but_a_node_list_is_refused() -> None:
    with pytest.raises(ValueError, match="NodeList"):
        pools_from_node_list({"kind": "ConfigMap"})


def test_seed003_the_proposals_node_group_table_leaves_only_the_group_with_a_node_per_replica() -> None:
    """KAITO's proposal's example (docs/seeds.md, "One node group for every replica"): node groups A100 4 x 40960
    (2 nodes), A100 8 x 81920 (1 node), A10 1 x 24576 (1 node); a preset of 8GB per replica with 2 replicas.
    NodeGroupSizeFilter drops the groups with fewer nodes than replicas (KAITO places one replica per node, no
    bin-packing), so only A100 4 x 40 GB, which has 2 nodes, remains: Berth's `homogeneous` placement picks it, and
    refuses with KAITO's denial when it is gone."""
    a100_40 = {"product": "NVIDIA-A100-SXM4-40GB", "count": "4", "memory": "40960"}
    items = [
        node("a100-40-a", **a100_40),
        node("a100-40-b", **a100_40),
        node("a100-80", product="NVIDIA-A100-SXM4-80GB", count="8", memory="81920"),
        node("a10", product="NVIDIA-A10", count="1", memory="24576"),
    ]

    def byo(nodes: list[dict[str, object]]) -> tuple[InferenceCluster, dict[str, object]]:
        derived = pools_from_node_list({"kind": "NodeList", "items": nodes})
        pools = [p.model_dump(by_alias=True, exclude_none=True) for p in derived.pools]
        document = {
            "apiVersion": API,
            "kind": "InferenceCluster",
            "metadata": {"name": "byo"},
            "spec": {"nodePools": pools},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "gateway": {"address": "10.1.0.1"}},
        }
        return InferenceCluster.model_validate(document), classes(*derived.classes(API))

    serve = engine("serve", member("Standalone", resources={"gpuMemory": "8Gi"}))
    preset = deployment("phi-4-mini", serve, replicas=2, homogeneous=True)
    cluster_all, known = byo(items)
    result = plan(preset, [cluster_all], known)
    assert [(r.engines[0].pool, r.engines[0].members[0].fit) for r in result.replicas] == [
        ("nvidia-a100-sxm4-40gb-4x40960mi", "OneGpu")
    ] * 2
    cluster_without, known = byo(items[2:])  # the A100 4 x 40 GB group gone: no group has 2 nodes
    refused = plan(preset, [cluster_without], known)
    assert refused.replicas == [] and refused.status.reason == "NoSuitableNodeGroup"
    assert refused.status.message.startswith(
        "No suitable node group found: insufficient capacity or no matching configurations after filtering."
    )
