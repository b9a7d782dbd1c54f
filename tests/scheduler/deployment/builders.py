"""Builders shared by the fleet scheduler tests: fleet objects in Modelplane's shape, from a few arguments.

This module holds no tests. Each builder goes through the same pydantic models a manifest does, so a test
exercises exactly what a YAML file would produce.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from contracts.fleet_plan import FleetPlan
from fleet.deployment import ModelDeployment
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica
from scheduler.deployment import schedule_deployment

API = "modelplane.ai/v1alpha1"


def product_is(product: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].productName == "{product}"'


def memory_at_least(quantity: str) -> str:
    return f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{quantity}")) >= 0'


def gpu(product: str, count: int = 8, memory: str = "80Gi", name: str = "gpu", claim: str = "DRA") -> dict[str, Any]:
    return {
        "name": name,
        "claim": claim,
        "driver": "gpu.nvidia.com",
        "count": count,
        "attributes": {"productName": {"string": product}},
        "capacity": {"memory": {"value": memory}},
    }


def inference_class(name: str, *devices: dict[str, Any], capabilities: Sequence[str] = ()) -> InferenceClass:
    return InferenceClass.model_validate(
        {
            "apiVersion": API,
            "kind": "InferenceClass",
            "metadata": {"name": name},
            "spec": {"devices": list(devices), "capabilities": list(capabilities)},
        }
    )


def classes(*items: InferenceClass) -> dict[str, InferenceClass]:
    return {c.metadata.name: c for c in items}


def cluster(
    name: str,
    pools: Sequence[tuple[str, str, int | None]],
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    gateway: str | None = "10.0.0.1",
    taints: Sequence[dict[str, str]] = (),
    status: bool = True,
    annotations: dict[str, str] | None = None,
    deletion_timestamp: str | None = None,
) -> InferenceCluster:
    """pools: (pool name, class name, node count) in published order."""
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    if deletion_timestamp is not None:
        metadata["deletionTimestamp"] = deletion_timestamp
    document: dict[str, Any] = {
        "apiVersion": API,
        "kind": "InferenceCluster",
        "metadata": metadata,
        "spec": {
            "taints": list(taints),
            "nodePools": [
                {"name": p, "className": c, **({"nodeCount": n} if n is not None else {})} for p, c, n in pools
            ],
        },
    }
    if status:
        document["status"] = {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "gateway": {"address": gateway} if gateway else {},
        }
    return InferenceCluster.model_validate(document)


def member(
    role: str = "Standalone",
    *selectors: str,
    count: int = 1,
    workers: int | None = None,
    requests: list[dict[str, Any]] | None = None,
    resources: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A member; with no selectors, requests or resources it carries no nodeSelector and rides along."""
    body: dict[str, Any] = {"role": role}
    if workers is not None:
        body["worker"] = {"nodes": workers}
    if requests is not None:
        body["nodeSelector"] = {"devices": requests}
    elif selectors:
        body["nodeSelector"] = {
            "devices": [{"name": "gpu", "count": count, "selectors": [{"cel": s} for s in selectors]}]
        }
    if resources is not None:
        body["resources"] = resources
    return body


def engine(name: str, *members: dict[str, Any], copies: int = 1) -> dict[str, Any]:
    return {"name": name, "copies": copies, "members": list(members)}


def standalone(name: str, *selectors: str, count: int = 1, copies: int = 1) -> dict[str, Any]:
    return engine(name, member("Standalone", *selectors, count=count), copies=copies)


def deployment(
    name: str,
    *engines: dict[str, Any],
    replicas: int = 1,
    min_replicas: int | None = None,
    match_labels: dict[str, str] | None = None,
    tolerations: Sequence[dict[str, str]] = (),
    requirements: Sequence[str] = (),
    strategy: str | None = None,
    scale_down_order: str | None = None,
    fit_granularity: str | None = None,
    homogeneous: bool = False,
) -> ModelDeployment:
    spec: dict[str, Any] = {
        "engines": list(engines),
        "tolerations": list(tolerations),
        "requirements": list(requirements),
    }
    if match_labels is not None:
        spec["clusterSelector"] = {"matchLabels": match_labels}
    if strategy is not None:
        spec["placementStrategy"] = strategy
    if scale_down_order is not None:
        spec["scaleDownOrder"] = scale_down_order
    if fit_granularity is not None:
        spec["fitGranularity"] = fit_granularity
    if homogeneous:
        spec["homogeneous"] = True
    body: dict[str, Any] = {"replicas": replicas, "template": {"spec": spec}}
    if min_replicas is not None:
        body["minReplicas"] = min_replicas
    return ModelDeployment.model_validate(
        {"apiVersion": API, "kind": "ModelDeployment", "metadata": {"name": name}, "spec": body}
    )


def replica(
    deployment_name: str,
    cluster_name: str,
    index: int,
    engines: Sequence[tuple[str, int, Sequence[tuple[str, str | None, bool]]]],
    *,
    name: str | None = None,
    worker_nodes: int = 1,
    conditions: Sequence[dict[str, str]] | None = None,
) -> ModelReplica:
    """engines: (engine name, copies, [(role, pinned pool, claims devices)]); `conditions`: its status's."""
    return ModelReplica.model_validate(
        {
            "apiVersion": API,
            "kind": "ModelReplica",
            "metadata": {
                "name": name or f"{deployment_name}-{cluster_name}-{index}",
                "labels": {
                    "modelplane.ai/deployment": deployment_name,
                    "modelplane.ai/cluster": cluster_name,
                    "modelplane.ai/replica-index": str(index),
                },
            },
            "spec": {
                "clusterName": cluster_name,
                "engines": [
                    {
                        "name": engine_name,
                        "copies": copies,
                        "members": [
                            {
                                "role": role,
                                **({"worker": {"nodes": worker_nodes}} if role == "Worker" else {}),
                                **({"nodePoolName": pool} if pool else {}),
                                **({"deviceRequests": [{"name": "gpu", "count": 1}]} if claims else {}),
                            }
                            for role, pool, claims in members
                        ],
                    }
                    for engine_name, copies, members in engines
                ],
            },
            **({"status": {"conditions": list(conditions)}} if conditions is not None else {}),
        }
    )


def plan(
    target: ModelDeployment,
    clusters: Iterable[InferenceCluster],
    known: dict[str, InferenceClass],
    replicas: Iterable[ModelReplica] = (),
) -> FleetPlan:
    return schedule_deployment(target, list(clusters), known, list(replicas))


def where(result: FleetPlan) -> list[tuple[str, int, str]]:
    """(cluster, index, origin) of every replica in the plan, in plan order."""
    return [(r.cluster, r.index, r.origin) for r in result.replicas]


def pools_of(result: FleetPlan) -> dict[tuple[str, int], list[str | None]]:
    """The pool of each engine of each replica, by (cluster, index)."""
    return {(r.cluster, r.index): [e.pool for e in r.engines] for r in result.replicas}
