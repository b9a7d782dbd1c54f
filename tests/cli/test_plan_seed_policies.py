"""Seed policies as `berth plan` shows them: partial scheduling only above minReplicas (seed 002), a resource fit
that refuses degenerate capacities instead of crashing (seeds 001/002), every replica on one cluster or one node
group when asked (seeds 002/003), and NodeLists planned as a bring-your-own cluster (seed 003)."""

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


# Seed 002: partial scheduling only above minReplicas.


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


# Seeds 001/002: the resource fit never crashes on a degenerate capacity.


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
