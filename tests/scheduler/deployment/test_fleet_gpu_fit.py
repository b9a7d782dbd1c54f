"""GPU-level resource fit (docs/seeds.md, "GPU-level fit"): `fitGranularity: Gpu` charges a member sized by model
memory only the GPUs its pods claim, so instances share a worker's GPUs, and the ledger never gives a GPU out twice.

The rules follow docs/seeds.md, "Resource fit from a memory need" and "Binpack and spread": candidates in the
order single GPU, several GPUs of one worker, across workers, CPU; binpack places an instance where the least room
is left, spread distributes instances over workers; and a vLLM-class backend counts on 90%
of each GPU (GPUStack starts vLLM with --gpu-memory-utilization 0.9). Every plan is fed back as the next plan's
input, as `berth plan` output is.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.fleet_plan import ClusterReason, FleetPlan
from fleet.replica import MEMBER_GPUS_ANNOTATION, ModelReplica, stamped_member_cost
from scheduler.deployment import manifest_dict, replica_manifest
from tests.scheduler.deployment.builders import classes, cluster, deployment, engine, gpu, inference_class, member, plan

H100 = inference_class("h100-8x", gpu("H100", memory="80Gi"), capabilities=["vllm", "custom"])
MIG = inference_class(
    "a100-mig",
    {
        "name": "mig-1g.10gb",
        "claim": "DRA",
        "driver": "gpu.nvidia.com",
        "count": 7,
        "attributes": {"productName": {"string": "A100-MIG-1g.10gb"}, "migProfile": {"string": "1g.10gb"}},
        "capacity": {"memory": {"value": "9856Mi"}},
    },
)
KNOWN = classes(H100, MIG)


def model(
    name: str,
    need: str,
    *,
    replicas: int = 1,
    granularity: str | None = "Gpu",
    backend: str | None = None,
    strategy: str | None = None,
    utilization: float | None = None,
) -> object:
    resources: dict[str, object] = {"gpuMemory": need}
    if backend is not None:
        resources["backend"] = backend
    if utilization is not None:
        resources["gpuMemoryUtilization"] = utilization
    return deployment(
        name,
        engine("serve", member("Standalone", resources=resources)),
        replicas=replicas,
        fit_granularity=granularity,
        strategy=strategy,
    )


def written(target: object, result: FleetPlan) -> list[ModelReplica]:
    """The plan's new replicas as `berth plan` writes them and the next plan reads them back."""
    return [ModelReplica.model_validate(manifest_dict(replica_manifest(target, r))) for r in result.new]


def held(replicas: list[ModelReplica]) -> list[tuple[str, list[int]]]:
    return [
        (r.metadata.name, r.spec.engines[0].members[0].gpus.nodes)  # type: ignore[union-attr]
        for r in replicas
    ]


ONE_NODE = [cluster("a", [("h100", "h100-8x", 1)])]


def test_one_gpu_instances_share_a_worker_instead_of_taking_a_node_each() -> None:
    by_node = plan(model("m", "60Gi", replicas=4, granularity=None), ONE_NODE, KNOWN)
    assert len(by_node.new) == 1  # Modelplane's ledger, the default: a whole node per pod
    by_gpu = plan(model("m", "60Gi", replicas=4), ONE_NODE, KNOWN)
    assert len(by_gpu.new) == 4
    placed = by_gpu.new[0].engines[0].members[0]
    assert (placed.fit, placed.nodes, placed.gpus.device, placed.gpus.per_pod, placed.gpus.nodes) == (
        "OneGpu",
        0,
        "gpu",
        1,
        [0],
    )


def test_the_replica_names_its_gpus_per_pod_and_the_next_plan_charges_exactly_them() -> None:
    target = model("m", "200Gi", replicas=2)  # 3 x 80Gi of one worker
    first = plan(target, ONE_NODE, KNOWN)
    replicas = written(target, first)
    member_written = manifest_dict(replica_manifest(target, first.new[0]))
    assert member_written["spec"]["engines"][0]["members"][0]["deviceRequests"][0]["count"] == 3
    stamped = json.loads(member_written["metadata"]["annotations"][MEMBER_GPUS_ANNOTATION])
    assert stamped == {"serve": {"0": {"device": "gpu", "nodes": [0]}}}
    # A third instance needs 3 more GPUs; 2 are left on the only worker: refused, naming the worker's GPUs.
    grown = plan(model("m", "200Gi", replicas=3), ONE_NODE, KNOWN, replicas)
    assert [r.origin for r in grown.replicas] == ["retained", "retained"]
    verdict = grown.status.clusters[0]
    assert verdict.reason is ClusterReason.INSUFFICIENT_NODES
    assert verdict.message == (
        "engine serve: pool h100: member 0 (Standalone) needs 3 x gpu on one node: "
        "node 0: 2 of 8 free (6 held by other instances); no node is wholly free"
    )


def test_gpus_held_by_another_deployment_are_not_free() -> None:
    other = model("other", "60Gi", replicas=7)
    others = written(other, plan(other, ONE_NODE, KNOWN))
    assert len(others) == 7
    mine = plan(model("mine", "100Gi"), ONE_NODE, KNOWN, others)  # two GPUs; one is left
    assert mine.new == []
    assert "node 0: 1 of 8 free (7 held by other instances)" in mine.status.clusters[0].message
    single = plan(model("mine", "60Gi"), ONE_NODE, KNOWN, others)
    assert held(written(model("mine", "60Gi"), single)) == [("mine-a-0", [0])]


def test_a_worker_holding_gpu_level_instances_is_never_given_out_whole_and_the_reverse() -> None:
    two = [cluster("a", [("h100", "h100-8x", 2)])]
    shared = model("shared", "60Gi")
    sharing = written(shared, plan(shared, two, KNOWN))
    whole = model("whole", "640Gi", replicas=2, granularity=None)  # a whole worker each (8 GPUs)
    result = plan(whole, two, KNOWN, sharing)
    assert len(result.new) == 1
    assert result.status.clusters[0].message == "engine serve: pool h100: needs 1 free node, has 0"
    # And a GPU-level instance never lands on a worker a node-level replica holds.
    wholes = written(whole, plan(whole, [cluster("a", [("h100", "h100-8x", 2)])], KNOWN))
    assert len(wholes) == 2
    assert plan(shared, two, KNOWN, wholes).new == []


@pytest.mark.parametrize(("strategy", "node"), [(None, 0), ("binpack", 0), ("spread", 1)])
def test_binpack_fills_the_fullest_worker_and_spread_distributes_over_workers(strategy: str | None, node: int) -> None:
    two = [cluster("a", [("h100", "h100-8x", 2)])]
    other = model("other", "200Gi")  # 3 GPUs on worker 0
    others = written(other, plan(other, two, KNOWN))
    target = model("m", "60Gi", strategy=strategy)
    assert held(written(target, plan(target, two, KNOWN, others))) == [("m-a-0", [node])]


def test_binpack_takes_the_worker_with_the_least_room_that_still_fits() -> None:
    three = [cluster("a", [("h100", "h100-8x", 3)])]
    fives = model("five", "400Gi")  # 5 GPUs of one worker
    sixes = model("six", "480Gi")  # 6 GPUs of one worker
    placed = written(fives, plan(fives, three, KNOWN))
    placed += written(sixes, plan(sixes, three, KNOWN, placed))
    assert held(placed) == [("five-a-0", [0]), ("six-a-0", [1])]
    two_gpus = model("m", "100Gi", strategy="binpack")  # 2 left on worker 1, 3 on worker 0: worker 1 is tighter
    assert held(written(two_gpus, plan(two_gpus, three, KNOWN, placed))) == [("m-a-0", [1])]
    spread = model("m", "100Gi", strategy="spread")  # a worker nobody uses
    assert held(written(spread, plan(spread, three, KNOWN, placed))) == [("m-a-0", [2])]


def test_a_vllm_instance_counts_on_90_percent_of_each_gpu_unless_told_otherwise() -> None:
    vllm = plan(model("m", "75Gi", backend="vllm"), ONE_NODE, KNOWN)  # 72Gi usable per 80Gi GPU
    assert (vllm.new[0].engines[0].members[0].fit, vllm.new[0].engines[0].members[0].gpus.per_pod) == (
        "GpusOfOneNode",
        2,
    )
    told = plan(model("m", "75Gi", backend="vllm", utilization=1.0), ONE_NODE, KNOWN)
    assert told.new[0].engines[0].members[0].gpus.per_pod == 1
    custom = plan(model("m", "75Gi", backend="custom"), ONE_NODE, KNOWN)
    assert custom.new[0].engines[0].members[0].gpus.per_pod == 1
    node_level = plan(model("m", "75Gi", backend="vllm", granularity=None), ONE_NODE, KNOWN)  # Modelplane's default
    assert node_level.new[0].engines[0].members[0].device_requests[0].count == 1


def test_the_headroom_is_named_when_no_gpu_holds_the_model() -> None:
    small = inference_class("l4", gpu("L4", count=1, memory="24Gi"), capabilities=["custom"])
    need = model("m", "23Gi", backend="custom", utilization=0.9)
    result = plan(need, [cluster("a", [("l4", "l4", 2)])], classes(small))
    assert result.new == []
    assert (
        "one GPU: the largest holds 24Gi (90% of it usable: gpuMemoryUtilization)" in result.status.clusters[0].message
    )


def test_mig_instances_are_given_out_one_model_each() -> None:
    mig_pool = [cluster("a", [("mig", "a100-mig", 1)])]
    target = model("m", "8Gi", replicas=8)
    result = plan(target, mig_pool, KNOWN)
    assert len(result.new) == 7  # seven 1g.10gb instances on the one worker, one model each
    assert {(r.engines[0].members[0].gpus.device, r.engines[0].members[0].gpus.per_pod) for r in result.new} == {
        ("mig-1g.10gb", 1)
    }
    assert "node 0: 0 of 7 free (7 held by other instances)" in result.status.clusters[0].message
    assert plan(model("m", "12Gi"), mig_pool, KNOWN).new == []  # instances never combine


def test_several_workers_stay_whole_nodes_under_gpu_granularity() -> None:
    two = [cluster("a", [("h100", "h100-8x", 2)])]
    result = plan(model("m", "1000Gi", backend="vllm"), two, KNOWN)  # 1000Gi / (8 x 72Gi) = 2 workers
    placed = result.new[0].engines[0].members[0]
    assert (placed.fit, placed.nodes, placed.span, placed.gpus) == ("SeveralNodes", 2, 2, None)


def test_copies_each_take_their_gpus_on_one_worker() -> None:
    two = [cluster("a", [("h100", "h100-8x", 2)])]
    target = deployment(
        "m",
        engine("serve", member("Standalone", resources={"gpuMemory": "300Gi"}), copies=3),  # 4 GPUs per copy
        fit_granularity="Gpu",
    )
    result = plan(target, two, KNOWN)
    assert held(written(target, result)) == [("m-a-0", [0, 0, 1])]
    again = plan(target, two, KNOWN, written(target, result))
    assert [r.origin for r in again.replicas] == ["retained"]


def test_a_malformed_gpu_annotation_is_an_error_naming_it() -> None:
    target = model("m", "60Gi")
    document = manifest_dict(replica_manifest(target, plan(target, ONE_NODE, KNOWN).new[0]))
    document["metadata"]["annotations"][MEMBER_GPUS_ANNOTATION] = "{not json"
    with pytest.raises(ValueError, match="berth.dev/member-gpus"):
        ModelReplica.model_validate(document)


NEEDS = ("10Gi", "60Gi", "100Gi", "200Gi", "300Gi", "640Gi", "1000Gi")


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 3),
    deployments=st.lists(
        st.tuples(
            st.sampled_from(NEEDS),
            st.integers(1, 4),
            st.sampled_from(["Gpu", "Gpu", None]),
            st.sampled_from([None, "binpack", "spread"]),
            st.sampled_from([None, "vllm"]),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_no_gpu_is_given_out_twice_and_no_worker_is_both_whole_and_shared(
    nodes: int, deployments: list[tuple[str, int, str | None, str | None, str | None]]
) -> None:
    pool = [cluster("a", [("h100", "h100-8x", nodes)])]
    placed: list[ModelReplica] = []
    for number, (need, replicas, granularity, strategy, backend) in enumerate(deployments):
        target = model(
            f"d{number}", need, replicas=replicas, granularity=granularity, strategy=strategy, backend=backend
        )
        placed += written(target, plan(target, pool, KNOWN, placed))
    whole = 0
    shared: dict[int, int] = {}
    for replica in placed:
        engine_written = replica.spec.engines[0]
        stamped = engine_written.members[0]
        if stamped.gpus is None:
            whole += stamped_member_cost(stamped, engine_written.copies)
        else:
            for node in stamped.gpus.nodes:
                shared[node] = shared.get(node, 0) + stamped.device_requests[0].count
    assert whole + len(shared) <= nodes
    assert all(count <= 8 for count in shared.values())
