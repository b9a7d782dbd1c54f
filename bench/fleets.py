"""The fleet file the benchmarks that start a stack apply: one region, one cluster of identical 8-GPU H200 hosts.

Each benchmark adds what it measures (its tenants, its priority classes, its region's queueing) and keeps the rest,
so that figures of different benchmarks are of the same hosts. (`bench.cohort_tree` writes its own fleet: it must
run against older trees too, so it imports nothing of bench/.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

BERTH = "berth.dev/v1alpha1"


def bench_fleet(
    nodes: int,
    *,
    tenants: Mapping[str, Mapping[str, Any]] | None = None,
    extra: Sequence[Mapping[str, Any]] = (),
    region: Mapping[str, Any] | None = None,
    prefix: str = "b-",
    first_index: int | None = None,
    gpus: int = 8,
) -> str:
    """Region `bench`, then `tenants` (name -> spec fields beside a quota no request reaches; a tenant `bench` when
    none are given), then the `extra` documents, then `nodes` hosts of `gpus` H200s named `prefix` + their index
    (from `first_index`: a file of one host among a larger fleet's) in cluster `bench-1`'s pool `slices`."""
    template: dict[str, Any] = {"count": nodes, "namePrefix": prefix, "gpusPerNode": gpus, "numaNodes": 2}
    if first_index is not None:
        template["firstIndex"] = first_index
    documents = [
        {
            "apiVersion": BERTH,
            "kind": "Region",
            "metadata": {"name": "bench"},
            "spec": {"prices": {"H200": 3.0}, **(region or {})},
        },
        *(
            {"apiVersion": BERTH, "kind": "Tenant", "metadata": {"name": name}, "spec": {"gpuQuota": 10**6, **spec}}
            for name, spec in (tenants if tenants is not None else {"bench": {}}).items()
        ),
        *extra,
        {
            "apiVersion": "modelplane.ai/v1alpha1",
            "kind": "InferenceClass",
            "metadata": {"name": "h200"},
            "spec": {"devices": [{"name": "gpu", "driver": "gpu.nvidia.com", "count": gpus}]},
        },
        {
            "apiVersion": BERTH,
            "kind": "InferenceCluster",
            "metadata": {"name": "bench-1"},
            "spec": {
                "region": "bench",
                "nodePools": [
                    {
                        "name": "slices",
                        "className": "h200",
                        "shape": "gpu_slice",
                        "gpuProduct": "H200",
                        "nodeTemplate": template,
                    }
                ],
            },
        },
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)
