"""Benchmark: one full recompute of the fleet scheduler for a large ModelDeployment.

    python -m bench.fleet_plan [--runs 7] [--clusters 10,100,1000]

1,000 replicas of a two-engine deployment (a prefill gang of a Leader and a Worker on 141Gi GPUs, and a decode
engine on H100s) over N clusters of 8 pools of 8 nodes each, with 50 other deployments whose replicas (one per
cluster, at least one per deployment: 50 x 20 at N = 1,000) already hold a node each.
For each N it reports the median wall time of `schedule_deployment` over several runs in two situations:

* cold: no replica of the deployment exists yet, so every replica is filled from scratch;
* steady: every replica the cold plan placed exists, so every one is checked and retained.

It also checks the CEL promise: one recompute evaluates each distinct (selector, device) pair it asks about
exactly once, however many pools publish the device. Inputs are built before timing; only scheduling is timed.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.stats import timed_ms
from contracts.fleet_plan import FleetPlan
from fleet.deployment import ModelDeployment
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica
from scheduler import cel
from scheduler.cel.device import prepare_device
from scheduler.deployment import replica_manifest, schedule_deployment
from scheduler.deployment import selectors as fleet_selectors

API = "modelplane.ai/v1alpha1"
REPLICAS = 1000
OTHER_DEPLOYMENTS = 50
NODES_PER_POOL = 8
# Eight GPU kinds, one class and one pool each, published in this order: the deployment's fits come last, so
# every pool is considered before a fit is found.
GPUS = [
    ("a10", "NVIDIA-A10", "24Gi", "Ampere"),
    ("l4", "NVIDIA-L4", "24Gi", "Ada"),
    ("l40s", "NVIDIA-L40S", "48Gi", "Ada"),
    ("a100-40", "NVIDIA-A100-SXM4-40GB", "40Gi", "Ampere"),
    ("a100-80", "NVIDIA-A100-SXM4-80GB", "80Gi", "Ampere"),
    ("mi300x", "AMD-MI300X", "192Gi", "CDNA3"),
    ("h100", "NVIDIA-H100-80GB-HBM3", "80Gi", "Hopper"),
    ("h200", "NVIDIA-H200", "141Gi", "Hopper"),
]
PREFILL = [
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("141Gi")) >= 0',
    'device.attributes["gpu.nvidia.com"].architecture == "Hopper"',
]
DECODE = ['device.attributes["gpu.nvidia.com"].productName == "NVIDIA-H100-80GB-HBM3"']


def build_classes() -> dict[str, InferenceClass]:
    result = {}
    for name, product, memory, architecture in GPUS:
        result[name] = InferenceClass.model_validate(
            {
                "apiVersion": API,
                "kind": "InferenceClass",
                "metadata": {"name": name},
                "spec": {
                    "devices": [
                        {
                            "name": "gpu",
                            "driver": "gpu.nvidia.com",
                            "count": 8,
                            "attributes": {
                                "productName": {"string": product},
                                "architecture": {"string": architecture},
                            },
                            "capacity": {"memory": {"value": memory}},
                        }
                    ]
                },
            }
        )
    return result


def build_clusters(count: int) -> list[InferenceCluster]:
    return [
        InferenceCluster.model_validate(
            {
                "apiVersion": API,
                "kind": "InferenceCluster",
                "metadata": {"name": f"cluster-{n:04d}", "labels": {"tier": "prod"}},
                "spec": {"nodePools": [{"name": g[0], "className": g[0], "nodeCount": NODES_PER_POOL} for g in GPUS]},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "gateway": {"address": f"10.{n // 256}.{n % 256}.1"},
                    "gpuPools": [{"name": g[0], "nodes": NODES_PER_POOL} for g in GPUS],
                },
            }
        )
        for n in range(count)
    ]


def request(expressions: Sequence[str], count: int) -> dict[str, Any]:
    return {"devices": [{"name": "gpu", "count": count, "selectors": [{"cel": e} for e in expressions]}]}


def build_deployment() -> ModelDeployment:
    prefill = {
        "name": "prefill",
        "members": [
            {"role": "Leader", "nodeSelector": request(PREFILL, 8)},
            {"role": "Worker", "worker": {"nodes": 1}, "nodeSelector": request(PREFILL, 8)},
        ],
    }
    decode = {"name": "decode", "members": [{"role": "Standalone", "nodeSelector": request(DECODE, 4)}]}
    return ModelDeployment.model_validate(
        {
            "apiVersion": API,
            "kind": "ModelDeployment",
            "metadata": {"name": "llama-70b"},
            "spec": {
                "replicas": REPLICAS,
                "template": {
                    "spec": {"clusterSelector": {"matchLabels": {"tier": "prod"}}, "engines": [prefill, decode]}
                },
            },
        }
    )


def build_other_replicas(clusters: Sequence[InferenceCluster]) -> list[ModelReplica]:
    """50 deployments' replicas, each holding one node of an H100 or A100 pool, round-robin over clusters."""
    each = max(1, len(clusters) // OTHER_DEPLOYMENTS)
    result = []
    for d in range(OTHER_DEPLOYMENTS):
        for r in range(each):
            cluster = clusters[(d * each + r) % len(clusters)].metadata.name
            pool = ("h100", "a100-80")[(d + r) % 2]
            name = f"other-{d:02d}"
            result.append(
                ModelReplica.model_validate(
                    {
                        "apiVersion": API,
                        "kind": "ModelReplica",
                        "metadata": {
                            "name": f"{name}-{cluster}-{r}",
                            "labels": {"modelplane.ai/deployment": name, "modelplane.ai/replica-index": str(r)},
                        },
                        "spec": {
                            "clusterName": cluster,
                            "engines": [
                                {
                                    "name": "serve",
                                    "copies": 1,
                                    "members": [
                                        {
                                            "role": "Standalone",
                                            "nodePoolName": pool,
                                            "deviceRequests": [{"name": "gpu"}],
                                        }
                                    ],
                                }
                            ],
                        },
                    }
                )
            )
    return result


def distinct_pairs_asked(run: Callable[[], FleetPlan]) -> tuple[set[tuple[str, str]], int]:
    """Run once with every selector recording the (expression, device content) pairs it is asked about, and
    return them with the number of CEL evaluations the run performed."""
    asked: set[tuple[str, str]] = set()

    class Recording:
        def __init__(self, selector: cel.Selector) -> None:
            self.selector = selector

        def matches(self, device: dict[str, Any]) -> bool:
            asked.add((self.selector.expression, prepare_device(device).key))
            return self.selector.matches(device)

    cel.compile_selector.cache_clear()  # forget outcomes remembered by earlier runs in this process
    original = fleet_selectors.compile_selector
    fleet_selectors.compile_selector = lambda expression: Recording(original(expression))  # type: ignore[assignment]
    try:
        before = cel.evaluation_count()
        run()
        return asked, cel.evaluation_count() - before
    finally:
        fleet_selectors.compile_selector = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per point (median reported)")
    parser.add_argument("--clusters", default="10,100,1000", help="comma-separated cluster counts")
    args = parser.parse_args()

    classes = build_classes()
    target = build_deployment()
    print(
        f"fleet plan: {REPLICAS} replicas of a two-engine deployment, 8 pools per cluster, "
        f"{OTHER_DEPLOYMENTS} other deployments; median of {args.runs} runs"
    )
    columns = ("clusters", "others", "placed", "cold ms", "steady ms", "CEL evaluations", "distinct pairs")
    print("  ".join(f"{c:>{max(len(c), 6)}}" for c in columns))
    for count in (int(n) for n in args.clusters.split(",")):
        clusters = build_clusters(count)
        others = build_other_replicas(clusters)

        def cold(clusters: list[InferenceCluster] = clusters, others: list[ModelReplica] = others) -> FleetPlan:
            return schedule_deployment(target, clusters, classes, others)

        asked, evaluations = distinct_pairs_asked(cold)
        placed = [replica_manifest(target, r) for r in cold().new]
        existing = others + placed

        def steady(clusters: list[InferenceCluster] = clusters, existing: list[ModelReplica] = existing) -> FleetPlan:
            return schedule_deployment(target, clusters, classes, existing)

        assert steady().status.new == 0
        cells = (
            count,
            len(others),
            len(placed),
            statistics.median(timed_ms(cold, args.runs)),
            statistics.median(timed_ms(steady, args.runs)),
            evaluations,
            len(asked),
        )
        print(
            "  ".join(
                f"{v:>{max(len(c), 6)}.1f}" if isinstance(v, float) else f"{v:>{max(len(c), 6)}}"
                for c, v in zip(columns, cells, strict=True)
            )
        )


if __name__ == "__main__":
    main()
