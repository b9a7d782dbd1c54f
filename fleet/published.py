"""The devices a cluster publishes for its pools (`status.gpuPools[].devices`), as classes the matcher can read.

Modelplane's scheduler matches a deployment's device requests against what the cluster publishes, never against
the InferenceClass itself: the published devices are a copy of the class's as the cluster's controller last saw
them. Berth does the same when a status publishes devices, and falls back to the class the pool's spec entry names
when it does not (a fleet file written by hand). A pool whose published devices equal its class's keeps the class's
name, so every such pool still shares one set of match results; one that differs gets a class of its own, named
`<cluster>/<pool>` (never a valid object name, so it cannot collide with a real class).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleet.inference_class import InferenceClass, InferenceClassSpec
from fleet.inference_cluster import GpuPoolStatus, InferenceCluster, NodePool
from fleet.meta import ObjectMeta


def published_class_name(
    cluster: InferenceCluster, pool: GpuPoolStatus, declared_class: str | None, classes: Mapping[str, InferenceClass]
) -> str | None:
    """The class the matcher reads for a published pool: the declared one, or `<cluster>/<pool>` when the status
    publishes devices that differ from it (or the pool is not declared in spec.nodePools at all)."""
    if pool.devices is None:
        return declared_class
    known = classes.get(declared_class) if declared_class is not None else None
    if known is not None and list(known.spec.devices) == list(pool.devices):
        return declared_class
    return f"{cluster.metadata.name}/{pool.name}"


def with_published_devices(
    clusters: Iterable[InferenceCluster], classes: Mapping[str, InferenceClass]
) -> tuple[list[InferenceCluster], dict[str, InferenceClass]]:
    """The fleet scheduler's inputs with published devices in force: each pool whose status publishes devices of its
    own points (through its spec.nodePools entry, added when the status publishes a pool the spec does not declare)
    at a class holding exactly those devices. Clusters without published devices come back unchanged."""
    effective: dict[str, InferenceClass] = dict(classes)
    result: list[InferenceCluster] = []
    for cluster in clusters:
        if cluster.status is None or not any(p.devices is not None for p in cluster.status.gpu_pools):
            result.append(cluster)
            continue
        pools = list(cluster.spec.node_pools)
        declared = {p.name: i for i, p in enumerate(pools)}
        for status_pool in cluster.status.gpu_pools:
            position = declared.get(status_pool.name)
            declared_class = pools[position].class_name if position is not None else None
            name = published_class_name(cluster, status_pool, declared_class, classes)
            if name is None or name == declared_class:
                continue
            effective[name] = _published_class(name, cluster, status_pool, classes.get(declared_class or ""))
            if position is None:
                # model_construct: the class name is deliberately not an object name (see the module docstring).
                pools.append(NodePool.model_construct(name=status_pool.name, class_name=name, node_count=0))
                declared[status_pool.name] = len(pools) - 1
            else:
                pools[position] = pools[position].model_copy(update={"class_name": name})
        spec = cluster.spec.model_copy(update={"node_pools": pools})
        result.append(cluster.model_copy(update={"spec": spec}))
    return result, effective


def _published_class(
    name: str, cluster: InferenceCluster, pool: GpuPoolStatus, base: InferenceClass | None
) -> InferenceClass:
    """A class holding the pool's published devices; the declared class's capabilities (Berth's) carry over."""
    capabilities = list(base.spec.capabilities) if base is not None else []
    return InferenceClass.model_construct(
        api_version=cluster.api_version,
        kind="InferenceClass",
        metadata=ObjectMeta.model_construct(name=name, namespace=None, labels={}, annotations={}),
        spec=InferenceClassSpec.model_construct(devices=list(pool.devices or []), capabilities=capabilities),
        status=None,
    )
