"""Seed policies as `berth plan` shows them (each a section of docs/seeds.md): partial scheduling only above
minReplicas, a resource fit that refuses degenerate capacities instead of crashing, every replica on one cluster or
one node group when asked, NodeLists planned as a bring-your-own cluster, replicas moving off a draining pool under
singleCluster, and GPU-level spread across pools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
import yaml
from typer.testing import CliRunner

from cli.plan import plan

API = "modelplane.ai/v1alpha1"
app = typer.Typer(add_completion=False)
app.command()(plan)
runner = CliRunner()


def gpu_class(name: str, memory: str = "80Gi", count: int = 8, capabilities: list[str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceClass",
        "metadata": {"name": name},
        "spec": {
            "capabilities": capabilities or ["vllm"],
            "devices": [
                {
                    "name": "gpu",
                    "claim": "DRA",
                    "driver": "gpu.nvidia.com",
                    "count": count,
                    "attributes": {"productName": {"string": "NVIDIA-H100"}},
                    "capacity": {"memory": {"value": memory}},
                }
            ],
        },
    }


def inference_cluster(name: str, pools: list[tuple[str, str, int]], ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceCluster",
        "metadata": {"name": name},
        "spec": {"nodePools": [{"name": p, "className": c, "nodeCount": n} for p, c, n in pools]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "gateway": {"address": "203.0.113.1"},
            "gpuPools": [{"name": p, "nodes": n} for p, _, n in pools],
        },
    }


def model(name: str, replicas: int, min_replicas: int | None = None, **template: Any) -> dict[str, Any]:
    members = template.pop("members", None) or [
        {
            "role": "Standalone",
            "nodeSelector": {"devices": [{"name": "gpu", "count": 8, "selectors": [{"cel": "true"}]}]},
        }
    ]
    spec: dict[str, Any] = {
        "replicas": replicas,
        "template": {"spec": {"engines": [{"name": "serve", "members": members}], **template}},
    }
    if min_replicas is not None:
        spec["minReplicas"] = min_replicas
    return {"apiVersion": API, "kind": "ModelDeployment", "metadata": {"name": name}, "spec": spec}


def write(tmp_path: Path, name: str, *documents: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return str(path)


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def plan_json(*files: str, extra: tuple[str, ...] = ()) -> tuple[int, dict[str, Any]]:
    code, out = run(*[a for f in files for a in ("-f", f)], *extra, "--output", "json")
    return code, json.loads(out)


# docs/seeds.md, "Partial scheduling above minReplicas".


def test_below_min_replicas_nothing_new_is_placed_and_the_plan_says_how_many_could_have_been(tmp_path: Path) -> None:
    fleet = write(tmp_path, "fleet.yaml", gpu_class("h100-8x"), inference_cluster("a", [("h100", "h100-8x", 2)]))
    deployment = write(tmp_path, "d.yaml", model("llama", replicas=4, min_replicas=3))
    code, out = run("-f", fleet, "-f", deployment)
    assert code == 1
    assert (
        "# ModelDeployment llama: ScheduleFailed: 2 of 4 replicas can be scheduled, fewer than minReplicas 3: "
        "no new replica placed (checked 1 clusters)" in out
    )
    assert "kind: ModelReplica" not in out  # nothing for the deployment workflow to start
    assert "#   a: InsufficientNodes: engine serve: pool h100: needs 1 free node, has 0" in out

    # Enough room for minReplicas: partial scheduling places what fits.
    roomier = write(tmp_path, "roomier.yaml", gpu_class("h100-8x"), inference_cluster("a", [("h100", "h100-8x", 3)]))
    code, document = plan_json(roomier, deployment)
    assert code == 0
    assert document["plans"][0]["status"]["phase"] == "PartiallyScheduled"
    assert len(document["plans"][0]["newReplicas"]) == 3


def test_retained_replicas_count_toward_min_replicas_and_are_kept_when_it_is_not_reached(tmp_path: Path) -> None:
    fleet = write(tmp_path, "fleet.yaml", gpu_class("h100-8x"), inference_cluster("a", [("h100", "h100-8x", 2)]))
    code, first = plan_json(fleet, write(tmp_path, "d1.yaml", model("llama", replicas=2)))
    assert code == 0 and len(first["plans"][0]["newReplicas"]) == 2
    running = write(tmp_path, "running.yaml", *first["plans"][0]["newReplicas"])
    grown = write(tmp_path, "d2.yaml", model("llama", replicas=4, min_replicas=3))
    # Two run and hold both nodes, nothing more fits: 2 < 3, the two are kept, nothing is added or removed.
    code, again = plan_json(fleet, grown, running)
    status = again["plans"][0]["status"]
    assert code == 1
    assert (status["phase"], status["available"], status["retained"], status["new"]) == ("ScheduleFailed", 2, 2, 0)
    assert again["plans"][0]["dropped"] == []
    # A third node appears: 3 >= 3, so the third replica is placed beside the two kept ones.
    bigger = write(tmp_path, "bigger.yaml", gpu_class("h100-8x"), inference_cluster("a", [("h100", "h100-8x", 3)]))
    code, third = plan_json(bigger, grown, running)
    assert code == 0 and third["plans"][0]["status"]["phase"] == "PartiallyScheduled"
    assert [(r["origin"], r["index"]) for r in third["plans"][0]["replicas"]] == [
        ("retained", 0),
        ("retained", 1),
        ("new", 2),
    ]


# docs/seeds.md, "Resource fit from a memory need": it never crashes on a degenerate capacity.


def test_a_device_publishing_zero_or_unusable_memory_is_a_refusal_with_a_reason_not_a_crash(tmp_path: Path) -> None:
    members = [{"role": "Standalone", "resources": {"gpuMemory": "100Gi", "backend": "vllm"}}]
    deployment = write(tmp_path, "d.yaml", model("qwen", replicas=1, members=members))
    for memory in ("0", "-80Gi", "1e999"):
        fleet = write(
            tmp_path, "fleet.yaml", gpu_class("broken", memory=memory), inference_cluster("a", [("p", "broken", 4)])
        )
        code, out = run("-f", fleet, "-f", deployment)
        assert code == 1, out
        assert "Traceback" not in out
        assert f"device gpu: memory '{memory}' is not" in out
        assert "#   a: NoMatchingPool: engine serve: pool p: member 0 (Standalone): needs 100Gi of GPU memory" in out


def test_a_memory_need_that_is_not_a_usable_quantity_is_refused_per_pool(tmp_path: Path) -> None:
    members = [{"role": "Standalone", "resources": {"gpuMemory": "0", "backend": "vllm"}}]
    fleet = write(tmp_path, "fleet.yaml", gpu_class("h100-8x"), inference_cluster("a", [("h100", "h100-8x", 4)]))
    code, out = run("-f", fleet, "-f", write(tmp_path, "d.yaml", model("zero", replicas=1, members=members)))
    assert code == 1
    assert "gpuMemory '0' is not a positive, finite quantity" in out


# docs/seeds.md, "A model on one cluster" (singleCluster) and "One node group for every replica" (homogeneous).


def where(document: dict[str, Any]) -> list[tuple[str, str, int, str]]:
    """(origin, cluster, index, pool of the first engine) of every replica in the first plan."""
    return [(r["origin"], r["cluster"], r["index"], r["engines"][0]["pool"]) for r in document["plans"][0]["replicas"]]


def two_clusters(tmp_path: Path, a: int, b: int, name: str = "fleet.yaml") -> str:
    return write(
        tmp_path,
        name,
        gpu_class("h100-8x"),
        inference_cluster("a", [("h100", "h100-8x", a)]),
        inference_cluster("b", [("h100", "h100-8x", b)]),
    )


def test_single_cluster_puts_every_replica_on_one_cluster_that_holds_them_all(tmp_path: Path) -> None:
    fleet = two_clusters(tmp_path, 2, 4)
    code, spread = plan_json(fleet, write(tmp_path, "spread.yaml", model("m", replicas=3)))
    assert code == 0 and {c for _, c, _, _ in where(spread)} == {"a", "b"}  # Modelplane spreads by default
    code, single = plan_json(fleet, write(tmp_path, "single.yaml", model("m", replicas=3, singleCluster=True)))
    assert code == 0
    assert where(single) == [("new", "b", 0, "h100"), ("new", "b", 1, "h100"), ("new", "b", 2, "h100")]
    assert single["plans"][0]["status"]["phase"] == "FullyScheduled"


def test_single_cluster_prefers_the_cluster_already_hosting_the_model(tmp_path: Path) -> None:
    fleet = write(
        tmp_path,
        "fleet.yaml",
        gpu_class("h100-8x"),
        inference_cluster("a", [("h100", "h100-8x", 8)]),
        inference_cluster("z", [("h100", "h100-8x", 4)]),
    )
    only_z = write(tmp_path, "z.yaml", gpu_class("h100-8x"), inference_cluster("z", [("h100", "h100-8x", 4)]))
    code, initial = plan_json(only_z, write(tmp_path, "d2.yaml", model("m", replicas=2, singleCluster=True)))
    assert code == 0
    running = write(tmp_path, "running.yaml", *initial["plans"][0]["newReplicas"])
    code, grown = plan_json(fleet, write(tmp_path, "d3.yaml", model("m", replicas=3, singleCluster=True)), running)
    assert code == 0
    assert where(grown) == [("retained", "z", 0, "h100"), ("retained", "z", 1, "h100"), ("new", "z", 2, "h100")]


def test_single_cluster_refuses_with_a_reason_when_no_cluster_holds_every_replica_or_min_replicas(
    tmp_path: Path,
) -> None:
    fleet = two_clusters(tmp_path, 2, 2)
    code, out = run("-f", fleet, "-f", write(tmp_path, "d.yaml", model("m", replicas=3, singleCluster=True)))
    assert code == 1
    assert (
        "# ModelDeployment m: ScheduleFailed: no single cluster can hold 3 replicas (singleCluster): "
        "the most is 2 on cluster a" in out
    )
    assert "#   b: InsufficientNodes: holds 2 of 3 replicas: engine serve: pool h100: needs 1 free node, has 0" in out
    assert "kind: ModelReplica" not in out
    # With minReplicas 2, one cluster holding two is a partial schedule, still on one cluster.
    code, partial = plan_json(
        fleet, write(tmp_path, "p.yaml", model("m", replicas=3, min_replicas=2, singleCluster=True))
    )
    assert code == 0 and partial["plans"][0]["status"]["phase"] == "PartiallyScheduled"
    assert where(partial) == [("new", "a", 0, "h100"), ("new", "a", 1, "h100")]


def test_turning_single_cluster_on_gathers_the_replicas_on_the_cluster_that_holds_them(tmp_path: Path) -> None:
    fleet = two_clusters(tmp_path, 1, 4)
    code, spread = plan_json(fleet, write(tmp_path, "spread.yaml", model("m", replicas=2)))
    assert code == 0 and [c for _, c, _, _ in where(spread)] == ["a", "b"]
    running = write(tmp_path, "running.yaml", *spread["plans"][0]["newReplicas"])
    code, single = plan_json(fleet, write(tmp_path, "single.yaml", model("m", replicas=2, singleCluster=True)), running)
    assert code == 0
    assert where(single) == [("retained", "b", 0, "h100"), ("new", "b", 1, "h100")]
    assert [(d["name"], d["reason"], d["message"]) for d in single["plans"][0]["dropped"]] == [
        ("m-a-0", "SingleCluster", "singleCluster: the deployment runs on cluster b")
    ]


def test_homogeneous_puts_every_replica_on_one_node_group_with_room_for_all_of_them(tmp_path: Path) -> None:
    fleet = write(
        tmp_path,
        "fleet.yaml",
        gpu_class("h100-8x"),
        inference_cluster("a", [("small", "h100-8x", 2), ("large", "h100-8x", 3)]),
    )
    code, first_fit = plan_json(fleet, write(tmp_path, "ff.yaml", model("m", replicas=3)))
    assert code == 0 and [p for *_, p in where(first_fit)] == ["small", "small", "large"]
    code, grouped = plan_json(fleet, write(tmp_path, "h.yaml", model("m", replicas=3, homogeneous=True)))
    assert code == 0 and [p for *_, p in where(grouped)] == ["large", "large", "large"]

    code, out = run("-f", fleet, "-f", write(tmp_path, "big.yaml", model("m", replicas=4, homogeneous=True)))
    assert code == 1
    assert (
        "ScheduleFailed: No suitable node group found: insufficient capacity or no matching configurations "
        "after filtering. No node group holds 4 replicas: the most is 3 on node group large of cluster a" in out
    )
    assert "#   a: InsufficientNodes: holds 3 of 4 replicas on node group large: " in out


# docs/seeds.md, "Node groups from GPU Feature Discovery labels": a NodeList is planned as a bring-your-own cluster,
# never silently ignored.


def gfd_node(name: str, product: str, count: int, memory: int, **labels: str) -> dict[str, Any]:
    gfd = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.memory": str(memory)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {**gfd, **labels}}}


def node_list(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": list(nodes)}


A100 = "NVIDIA-A100-SXM4-40GB"
VLLM = {"capabilities.berth.dev/vllm": "true"}


def test_a_node_list_without_a_cluster_name_is_refused_not_ignored(tmp_path: Path) -> None:
    nodes = write(tmp_path, "nodes.yaml", node_list(gfd_node("w1", A100, 8, 40960)))
    code, out = run("-f", nodes, "-f", write(tmp_path, "d.yaml", model("m", replicas=1)))
    assert code == 2
    assert "a NodeList needs --cluster NAME" in out


def test_node_list_pools_carry_capabilities_from_labels_and_the_option(tmp_path: Path) -> None:
    nodes = write(
        tmp_path,
        "nodes.yaml",
        node_list(
            gfd_node("w1", A100, 8, 40960, **VLLM),
            gfd_node("w2", A100, 8, 40960, **VLLM),
            gfd_node("h1", "NVIDIA-H100-80GB-HBM3", 8, 81559, **VLLM),
            gfd_node("h2", "NVIDIA-H100-80GB-HBM3", 8, 81559),
        ),
    )
    members = [{"role": "Standalone", "resources": {"gpuMemory": "400Gi", "backend": "vllm"}}]
    deployment = write(tmp_path, "d.yaml", model("qwen", replicas=2, members=members))
    # Only the A100 nodes are all labelled vllm: 400Gi spans both of them (8 x 40Gi each), so one replica fits.
    code, labelled = plan_json(nodes, deployment, extra=("--cluster", "byo", "--gateway", "10.0.0.9"))
    assert code == 0
    assert [
        (r["cluster"], r["engines"][0]["pool"], r["engines"][0]["members"][0]["fit"])
        for r in labelled["plans"][0]["replicas"]
    ] == [("byo", "nvidia-a100-sxm4-40gb-8x40960mi", "SeveralNodes")]
    assert labelled["plans"][0]["replicas"][0]["gatewayAddress"] == "10.0.0.9"
    assert (
        "pool nvidia-h100-80gb-hbm3-8x81559mi: member 0 (Standalone): class nvidia-h100-80gb-hbm3-8x81559mi "
        "lacks capability vllm (offers none)" in labelled["plans"][0]["status"]["clusters"][0]["message"]
    )
    # The operator says every pool of the list serves vllm: 400Gi fits one H100 node, an earlier resource-fit step.
    code, option = plan_json(
        nodes, deployment, extra=("--cluster", "byo", "--gateway", "10.0.0.9", "--capabilities", "vllm")
    )
    assert code == 0
    assert [
        (r["engines"][0]["pool"], r["engines"][0]["members"][0]["fit"]) for r in option["plans"][0]["replicas"]
    ] == [("nvidia-h100-80gb-hbm3-8x81559mi", "GpusOfOneNode")] * 2
    # Without a gateway address the cluster takes no replica, and the plan says why.
    code, out = run("-f", nodes, "-f", deployment, "--cluster", "byo")
    assert code == 1 and "#   byo: NoGatewayAddress: the cluster has no gateway address" in out


def test_mig_partitioned_nodes_are_grouped_apart_and_never_count_as_whole_gpus(tmp_path: Path) -> None:
    mixed = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.5gb.count": "56",
        "nvidia.com/mig-1g.5gb.memory": "4864",
    }
    nodes = write(
        tmp_path,
        "nodes.yaml",
        node_list(
            gfd_node("whole", A100, 8, 40960),
            gfd_node("mixed", A100, 8, 40960, **mixed),
            gfd_node("single", f"{A100}-MIG-1g.5gb", 56, 4864, **{"nvidia.com/mig.strategy": "single"}),
        ),
    )
    product = f'device.attributes["gpu.nvidia.com"].productName == "{A100}"'
    members = [
        {
            "role": "Standalone",
            "nodeSelector": {"devices": [{"name": "gpu", "count": 8, "selectors": [{"cel": product}]}]},
        }
    ]
    deployment = write(tmp_path, "d.yaml", model("m", replicas=2, members=members))
    code, document = plan_json(nodes, deployment, extra=("--cluster", "byo", "--gateway", "10.0.0.9"))
    assert code == 0
    status = document["plans"][0]["status"]
    assert (status["phase"], status["available"]) == ("PartiallyScheduled", 1)  # only the whole-GPU node
    assert [r["engines"][0]["pool"] for r in document["plans"][0]["replicas"]] == ["nvidia-a100-sxm4-40gb-8x40960mi"]
    message = status["clusters"][0]["message"]
    assert "pool nvidia-a100-sxm4-40gb-mig-56x1g-5gb: member 0 (Standalone): request 'gpu': no device" in message
    # the single-strategy group name is over 40 characters: 31 of them and a hash
    assert "pool nvidia-a100-sxm4-40gb-mig-1g-5g-714d9441: member 0 (Standalone): request 'gpu': no device" in message
    # A memory need does not combine MIG instances either: 20Gi fits no 1g.5gb instance, only whole GPUs.
    by_memory = [{"role": "Standalone", "resources": {"gpuMemory": "20Gi"}}]
    code, fitted = plan_json(
        nodes,
        write(tmp_path, "mem.yaml", model("mem", replicas=3, members=by_memory)),
        extra=("--cluster", "byo", "--gateway", "10.0.0.9"),
    )
    assert [r["engines"][0]["pool"] for r in fitted["plans"][0]["replicas"]] == ["nvidia-a100-sxm4-40gb-8x40960mi"]


def test_the_mig_managers_labels_decide_whether_a_node_is_mig_as_kaito_reads_them(tmp_path: Path) -> None:
    """docs/seeds.md, "Node groups from GPU Feature Discovery labels" (MIG, as KAITO reads it): a node is
    MIG-partitioned when `nvidia.com/mig.config` names a layout other than a disabled one and
    `nvidia.com/mig.config.state` is `success`; `pending` is not MIG yet."""
    mixed = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.5gb.count": "56",
        "nvidia.com/mig-1g.5gb.memory": "4864",
    }

    def manager(layout: str, state: str) -> dict[str, str]:
        return {"nvidia.com/mig.config": layout, "nvidia.com/mig.config.state": state}

    nodes = write(
        tmp_path,
        "nodes.yaml",
        node_list(
            gfd_node("applied", A100, 8, 40960, **mixed, **manager("all-1g.5gb", "success")),
            gfd_node("pending", A100, 8, 40960, **manager("all-1g.5gb", "pending")),
            gfd_node("disabled", A100, 8, 40960, **manager("all-disabled", "success")),
            gfd_node("unknown-state", A100, 8, 40960, **manager("all-1g.5gb", "done")),
            gfd_node("unlabelled", A100, 8, 40960, **manager("all-1g.5gb", "success")),
        ),
    )
    product = f'device.attributes["gpu.nvidia.com"].productName == "{A100}"'
    members = [
        {
            "role": "Standalone",
            "nodeSelector": {"devices": [{"name": "gpu", "count": 8, "selectors": [{"cel": product}]}]},
        }
    ]
    deployment = write(tmp_path, "d.yaml", model("m", replicas=3, members=members))
    code, out = run("-f", nodes, "-f", deployment, "--cluster", "byo", "--gateway", "10.0.0.9", "--output", "json")
    assert code == 0
    reports, _, answer = out.partition("\n{")  # the skipped nodes (stderr, wrapped to the width), then the JSON
    assert " ".join(reports.split()) == (
        "skipped node unknown-state: nvidia.com/mig.config.state='done' is not one of success, pending, rebooting, "
        "failed skipped node unlabelled: nvidia.com/mig.config='all-1g.5gb' is applied, but GPU Feature Discovery "
        "publishes no MIG device (nvidia.com/gpu.product ending in -MIG-<profile>, or nvidia.com/mig-<profile>.count)"
    )
    plan = json.loads("{" + answer)["plans"][0]
    # the pending and the disabled node offer whole GPUs (one replica each); the applied layout is MIG
    assert [r["engines"][0]["pool"] for r in plan["replicas"]] == ["nvidia-a100-sxm4-40gb-8x40960mi"] * 2
    message = plan["status"]["clusters"][0]["message"]
    assert "pool nvidia-a100-sxm4-40gb-mig-56x1g-5gb: member 0 (Standalone): request 'gpu': no device" in message


GPUSTACK = Path(__file__).resolve().parents[2] / "examples" / "gpustack"


def test_a_gpustack_style_fleet_shows_gpu_level_placements_and_refusals_and_the_plan_reads_back(
    tmp_path: Path,
) -> None:
    """GPU-level fit (fitGranularity Gpu; docs/seeds.md, "GPU-level fit") on examples/gpustack: instances share
    workers, each row says which GPUs it holds, the refusal names every worker's free GPUs, and the written plan
    charges the same GPUs."""
    files = ["-f", str(GPUSTACK / "fleet.yaml"), "-f", str(GPUSTACK / "deployments.yaml")]
    shown = runner.invoke(app, files)
    assert shown.exit_code == 0, shown.output
    assert "GPUS" in shown.output
    assert "llama-70b-lab-1  lab      1      new     serve   h100  0      2 x gpu on node 0" in shown.output
    assert (
        "lab: InsufficientNodes: engine serve: pool h100: member 0 (Standalone) needs 1 x gpu on one node: "
        "node 0: 0 of 8 free (8 held by other instances); node 1: 0 of 8 free (8 held by other instances); "
        "no node is wholly free"
    ) in shown.output
    as_json = json.loads(runner.invoke(app, [*files, "--output", "json"]).output)
    member = as_json["plans"][0]["replicas"][1]["engines"][0]["members"][0]
    assert (member["fit"], member["nodes"], member["gpus"]) == (
        "GpusOfOneNode",
        0,
        {"device": "gpu", "perPod": 2, "nodes": [0]},
    )
    written = tmp_path / "placed.yaml"
    written.write_text(shown.output)
    again = json.loads(runner.invoke(app, [*files, "-f", str(written), "--output", "json"]).output)
    assert [p["status"]["new"] for p in again["plans"]] == [0, 0]  # every GPU is charged as it was placed
    assert [p["status"]["retained"] for p in again["plans"]] == [8, 2]


# docs/seeds.md, "Node groups from GPU Feature Discovery labels": GPU Feature Discovery labels
# `nvidia.com/mig.strategy` on every GPU node under the single or mixed strategy, whether or not a GPU is
# MIG-enabled (k8s-device-plugin's internal/lm/mig-strategy_test.go: "single non-mig device returns non-mig (none)
# labels" carries `nvidia.com/mig.strategy: single`), and the GPU operator's MIG guide installs with
# `--set mig.strategy=single`. A MIG-enabled node under that strategy has a product ending in
# `-MIG-<profile>`, or `-MIG-INVALID` with a count of 0 when its GPUs do not share one profile.


def test_gfds_single_strategy_label_alone_leaves_a_node_with_whole_gpus(tmp_path: Path) -> None:
    single = {"nvidia.com/mig.strategy": "single"}
    disabled = {**single, "nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success"}
    applied = {**single, "nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/mig.config.state": "success"}
    nodes = write(
        tmp_path,
        "nodes.yaml",
        node_list(
            gfd_node("v100", "Tesla-V100-SXM2-16GB", 8, 16160, **single),  # not MIG-capable: no MIG manager labels
            gfd_node("h100", "NVIDIA-H100-80GB-HBM3", 8, 81559, **disabled),
            gfd_node("a100", f"{A100}-MIG-1g.5gb", 56, 4864, **applied),  # the single strategy's MIG devices
            gfd_node("broken", f"{A100}-MIG-INVALID", 0, 0, **applied),  # GFD's label for a layout it cannot read
        ),
    )

    def selecting(attribute: str, value: str, count: int) -> list[dict[str, Any]]:
        cel = f'device.attributes["gpu.nvidia.com"].{attribute} == "{value}"'
        request = {"name": "gpu", "count": count, "selectors": [{"cel": cel}]}
        return [{"role": "Standalone", "nodeSelector": {"devices": [request]}}]

    deployments = write(
        tmp_path,
        "d.yaml",
        model("bert", replicas=1, members=selecting("productName", "Tesla-V100-SXM2-16GB", 8)),
        model("llama", replicas=1, members=selecting("productName", "NVIDIA-H100-80GB-HBM3", 8)),
        model("small", replicas=1, members=selecting("migProfile", "1g.5gb", 1)),
    )
    code, out = run("-f", nodes, "-f", deployments, "--cluster", "byo", "--gateway", "10.0.0.9", "--output", "json")
    assert code == 0, out
    reports, _, answer = out.partition("\n{")  # the skipped nodes (stderr, wrapped to the width), then the JSON
    assert " ".join(reports.split()) == (
        "skipped node broken: nvidia.com/gpu.product='NVIDIA-A100-SXM4-40GB-MIG-INVALID': GPU Feature Discovery "
        "found a MIG layout the single strategy cannot publish (a MIG-enabled GPU without MIG devices, GPUs with "
        "and without MIG, or more than one MIG profile)"
    )
    plans = {p["deployment"]: p for p in json.loads("{" + answer)["plans"]}
    assert {name: [r["engines"][0]["pool"] for r in p["replicas"]] for name, p in plans.items()} == {
        "bert": ["tesla-v100-sxm2-16gb-8x16160mi"],  # eight whole V100s, not `mig-unknown` devices
        "llama": ["nvidia-h100-80gb-hbm3-8x81559mi"],
        "small": ["nvidia-a100-sxm4-40gb-mig-1g-5g-714d9441"],  # the applied layout's GPU instances
    }


# docs/seeds.md, "Draining moves replicas one at a time": Seldon moves a model's replica off a draining server
# replica onto a free one; a model on at most one server (singleCluster) moves the same way, its replacement on the
# same cluster.


def test_single_cluster_moves_a_replica_off_a_draining_pool_onto_a_free_one(tmp_path: Path) -> None:
    def fleet(name: str, draining: bool) -> str:
        cluster = inference_cluster("a", [("p0", "h100-8x", 1), ("p1", "h100-8x", 1), ("p2", "h100-8x", 1)])
        if draining:
            cluster["metadata"]["annotations"] = {"berth.dev/draining-pools": "p1"}
        return write(tmp_path, name, gpu_class("h100-8x"), cluster)

    for options in ({"singleCluster": True}, {}):  # the one-server rule moves replicas as the spread does
        deployment = write(tmp_path, "d.yaml", model("m", replicas=2, min_replicas=2, **options))
        code, first = plan_json(fleet("steady.yaml", draining=False), deployment)
        assert code == 0 and where(first) == [("new", "a", 0, "p0"), ("new", "a", 1, "p1")]
        running = write(tmp_path, "running.yaml", *first["plans"][0]["newReplicas"])

        # Pool p1 drains: m-a-1 keeps serving while its replacement starts on the free pool p2.
        draining = fleet("draining.yaml", draining=True)
        code, moving = plan_json(draining, deployment, running)
        status = moving["plans"][0]["status"]
        assert code == 0, status
        assert where(moving) == [("retained", "a", 0, "p0"), ("retained", "a", 1, "p1"), ("new", "a", 2, "p2")]
        assert moving["plans"][0]["dropped"] == []
        assert (status["phase"], status["available"], status["moving"]) == ("FullyScheduled", 2, ["m-a-1"])
        assert status["message"] == (
            "2 of 2 replicas scheduled; moving 1 replica one at a time: m-a-1 (pool p1 of cluster a draining)"
        )

        # The replacement runs (a replica file without status is ready): m-a-1 goes, nothing more is placed.
        replaced = write(
            tmp_path, "replaced.yaml", *first["plans"][0]["newReplicas"], *moving["plans"][0]["newReplicas"]
        )
        code, moved = plan_json(draining, deployment, replaced)
        assert code == 0
        assert where(moved) == [("retained", "a", 0, "p0"), ("retained", "a", 2, "p2")]
        assert [(d["name"], d["reason"]) for d in moved["plans"][0]["dropped"]] == [("m-a-1", "Drained")]
        assert moved["plans"][0]["status"]["phase"] == "FullyScheduled"


# docs/seeds.md, "Binpack and spread": GPUStack's spread scores a worker without instances highest (its placement
# scorer's "level 1: max score, no model instances"), whichever pool the worker is in and whatever order the pools
# are listed in.


def test_spread_puts_an_instance_on_an_empty_worker_of_another_pool_whatever_the_pool_order(tmp_path: Path) -> None:
    pools = {"h100": ("h100", "h100-8x", 2), "l40s": ("l40s", "l40s-4x", 1)}
    members = [{"role": "Standalone", "resources": {"gpuMemory": "40Gi", "backend": "vllm"}}]  # one GPU of either
    deployment = write(
        tmp_path, "d.yaml", model("qwen", replicas=4, members=members, placementStrategy="spread", fitGranularity="Gpu")
    )
    for order in (["h100", "l40s"], ["l40s", "h100"]):
        fleet = write(
            tmp_path,
            "fleet.yaml",
            gpu_class("h100-8x"),
            gpu_class("l40s-4x", memory="48Gi", count=4),
            inference_cluster("lab", [pools[name] for name in order]),
        )
        code, document = plan_json(fleet, deployment)
        assert code == 0
        placed = [
            (r["engines"][0]["pool"], r["engines"][0]["members"][0]["gpus"]["nodes"])
            for r in document["plans"][0]["replicas"]
        ]
        # every worker takes one before any takes a second; then the worker with the most room (an H100's 7 GPUs)
        assert sorted(placed[:3]) == [("h100", [0]), ("h100", [1]), ("l40s", [0])], order
        assert placed[3][0] == "h100", order
