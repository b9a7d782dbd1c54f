"""Draining (docs/seeds.md, "Draining moves replicas one at a time"): clusters and pools that take no new replicas
and whose replicas move elsewhere, one at a time.

A cluster drains when it is being deleted (`metadata.deletionTimestamp`, the Kubernetes convention) or an operator
annotates it `berth.dev/draining: "true"`; some of its pools drain when it is annotated
`berth.dev/draining-pools: "a,b"` (applied with `berth apply` or `PUT /v1/fleet`, like any fleet change).

    fill        a draining cluster is ineligible (`Draining`), a draining pool is left out of every cluster's pools
    move        replicas on a draining cluster or pool stay while they are needed: of `replicas` wanted, those not
                covered by ready replicas elsewhere; one replacement is created elsewhere at a time, only while no
                replica elsewhere is still starting; a moving replica is removed (`Drained`) once a ready one
                elsewhere takes its place, never before, so the deployment never drops below what was serving
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica
from scheduler.deployment.pools import Pool

DRAINING_ANNOTATION = "berth.dev/draining"
DRAINING_POOLS_ANNOTATION = "berth.dev/draining-pools"


def cluster_draining(cluster: InferenceCluster) -> str | None:
    """Why the whole cluster drains, or None."""
    if cluster.metadata.deletion_timestamp is not None:
        return f"cluster {cluster.metadata.name} is being deleted (since {cluster.metadata.deletion_timestamp})"
    if cluster.metadata.annotations.get(DRAINING_ANNOTATION, "").lower() == "true":
        return f"cluster {cluster.metadata.name} is marked draining ({DRAINING_ANNOTATION})"
    return None


def draining_pools(cluster: InferenceCluster) -> frozenset[str]:
    raw = cluster.metadata.annotations.get(DRAINING_POOLS_ANNOTATION, "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def replica_draining(replica: ModelReplica, clusters: Mapping[str, InferenceCluster]) -> str | None:
    """Why the replica must move off where it runs, or None."""
    cluster = clusters.get(replica.cluster or "")
    if cluster is None:
        return None
    whole = cluster_draining(cluster)
    if whole is not None:
        return whole
    pools = draining_pools(cluster)
    held = sorted({m.node_pool_name for e in replica.spec.engines for m in e.members if m.node_pool_name in pools})
    if held:
        return f"pool{'s' if len(held) > 1 else ''} {', '.join(held)} of cluster {cluster.metadata.name} draining"
    return None


class WithoutDrainingPools(Mapping[str, tuple[Pool, ...]]):
    """The selected pools, less the draining ones: where new replicas may go."""

    def __init__(self, selected: Mapping[str, tuple[Pool, ...]], clusters: Mapping[str, InferenceCluster]) -> None:
        self._selected = selected
        self._clusters = clusters

    def __getitem__(self, name: str) -> tuple[Pool, ...]:
        draining = draining_pools(self._clusters[name])
        return tuple(pool for pool in self._selected[name] if pool.name not in draining)

    def __contains__(self, name: object) -> bool:
        return name in self._selected

    def __iter__(self) -> Iterator[str]:
        return iter(self._selected)

    def __len__(self) -> int:
        return len(self._selected)


def split(
    kept: Sequence[ModelReplica], clusters: Mapping[str, InferenceCluster]
) -> tuple[list[ModelReplica], list[tuple[ModelReplica, str]]]:
    """(replicas staying, (replica moving, why))."""
    staying: list[ModelReplica] = []
    moving: list[tuple[ModelReplica, str]] = []
    for replica in kept:
        why = replica_draining(replica, clusters)
        if why is None:
            staying.append(replica)
        else:
            moving.append((replica, why))
    return staying, moving
