"""What a cluster publishes to the fleet scheduler: its readiness, its gateway, and its pools in published order.

Modelplane's scheduler reads a cluster's observed status: Ready when a condition of type Ready has status "True",
a gateway address, and `status.gpuPools` with each pool's node count. Berth reads the same status when it is present
(offline plans give it explicitly). A cluster whose status lists no pools has its pools derived from
`spec.nodePools`: the Kubernetes pools, each with its `nodeCount`. Either way a pool's devices come from the
InferenceClass its spec entry names; slice and bare-metal pools serve allocations, not ModelDeployments.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from contracts.vocabulary import PoolShape
from fleet.inference_cluster import InferenceCluster


class Pool(NamedTuple):
    cluster: str
    name: str
    class_name: str | None  # None: the status publishes a pool that spec.nodePools does not declare
    nodes: int  # published node count, floored at 0 (missing or negative counts as none)
    excluded: tuple[str, ...] = ()  # observed nodes not counted, with why (`<node>: <why>`)


def published_pools(cluster: InferenceCluster) -> tuple[Pool, ...]:
    name = cluster.metadata.name
    declared = {pool.name: pool for pool in cluster.spec.node_pools}
    observed = cluster.status.gpu_pools if cluster.status is not None else []
    if observed:
        return tuple(
            Pool(
                cluster=name,
                name=pool.name,
                class_name=declared[pool.name].class_name if pool.name in declared else None,
                nodes=max(pool.nodes or 0, 0),
                excluded=tuple(pool.excluded or ()),
            )
            for pool in observed
        )
    return tuple(
        Pool(cluster=name, name=pool.name, class_name=pool.class_name, nodes=max(pool.node_count or 0, 0))
        for pool in cluster.spec.node_pools
        if pool.shape is PoolShape.KUBERNETES
    )


def gateway_address(cluster: InferenceCluster) -> str | None:
    gateway = cluster.status.gateway if cluster.status is not None else None
    return (gateway.address or None) if gateway is not None else None


def is_ready(cluster: InferenceCluster) -> bool:
    """Without a status block the cluster is not known to be Ready: the caller supplies observed status."""
    return cluster.status is not None and cluster.status.ready


def not_ready_message(cluster: InferenceCluster) -> str | None:
    """What the cluster's Ready condition says about why, when it says anything (the driver's observed reason)."""
    conditions = cluster.status.conditions if cluster.status is not None else []
    return next((c.message for c in conditions if c.type == "Ready" and c.message), None)


def matches_labels(cluster: InferenceCluster, match_labels: dict[str, str]) -> bool:
    """clusterSelector.matchLabels: plain string equality on every key; an empty selector matches every cluster."""
    labels = cluster.metadata.labels
    return all(labels.get(key) == value for key, value in match_labels.items())


class SelectedPools(Mapping[str, tuple[Pool, ...]]):
    """The pools of every cluster that matches clusterSelector, by cluster name in name order. A cluster's pools
    are read the first time they are asked for: a steady-state pass only reads the clusters hosting replicas."""

    def __init__(self, clusters: Mapping[str, InferenceCluster], match_labels: dict[str, str]) -> None:
        self._clusters = clusters
        self._names = [name for name in sorted(clusters) if matches_labels(clusters[name], match_labels)]
        self._selected = set(self._names)
        self._pools: dict[str, tuple[Pool, ...]] = {}

    def __getitem__(self, name: str) -> tuple[Pool, ...]:
        if name not in self._selected:
            raise KeyError(name)
        found = self._pools.get(name)
        if found is None:
            found = self._pools[name] = published_pools(self._clusters[name])
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._selected

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
