"""A whole fleet: every object of a fleet file, indexed by name, with node templates expanded.

This is the one in-memory picture of inventory that `berth apply` writes to PostgreSQL and that offline commands
(`berth explain -f`, `berth plan -f`) schedule against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.vocabulary import PoolShape
from fleet.cohort import Cohort
from fleet.deployment import ModelDeployment
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster, NodePool
from fleet.model_cache import ModelCache
from fleet.model_service import ModelService
from fleet.node import Node
from fleet.priority_class import PriorityClass
from fleet.region import Region
from fleet.replica import ModelReplica
from fleet.slot_state import SlotStateDocument
from fleet.template import expand_template
from fleet.tenant import Tenant


@dataclass(frozen=True)
class PoolHosts:
    """A slice or bare-metal pool with its concrete hosts (listed ones first, then generated ones)."""

    cluster: InferenceCluster
    pool: NodePool
    nodes: tuple[Node, ...]


@dataclass
class Fleet:
    regions: dict[str, Region] = field(default_factory=dict)
    tenants: dict[str, Tenant] = field(default_factory=dict)
    # Cohort objects: a cohort tenants name without one is a root with no quota of its own (scheduler/quota/cohorts.py).
    cohorts: dict[str, Cohort] = field(default_factory=dict)
    priority_classes: dict[str, PriorityClass] = field(default_factory=dict)
    classes: dict[str, InferenceClass] = field(default_factory=dict)
    clusters: dict[str, InferenceCluster] = field(default_factory=dict)
    # Namespaced kinds are keyed by name in the "default" namespace and by "<namespace>/<name>" elsewhere.
    deployments: dict[str, ModelDeployment] = field(default_factory=dict)
    # Observed replicas of every deployment; one whose cluster is gone is kept (the fleet scheduler drops it).
    replicas: dict[str, ModelReplica] = field(default_factory=dict)
    # ModelCaches, which constrain where a deployment with a modelCacheRef places new replicas (fleet/cache.py).
    caches: dict[str, ModelCache] = field(default_factory=dict)
    # Modelplane's ModelServices (traffic routing): checked against the XRD and carried, never placed or applied.
    services: dict[str, ModelService] = field(default_factory=dict)
    # What-if slot holds for offline `berth explain -f`; never applied to a database.
    slot_states: dict[str, SlotStateDocument] = field(default_factory=dict)
    # Kubernetes NodeLists of bring-your-own clusters, as read; `fleet.byo` turns them into pools (docs/seeds.md,
    # "Node groups from GPU Feature Discovery labels").
    node_lists: list[dict[str, Any]] = field(default_factory=list)

    def pools(self) -> list[PoolHosts]:
        """Every pool of every cluster, in cluster-name then published order, with hosts expanded."""
        result: list[PoolHosts] = []
        for ordinal, (cluster, pool) in enumerate(
            (c, p) for c in sorted(self.clusters.values(), key=lambda c: c.metadata.name) for p in c.spec.node_pools
        ):
            nodes = list(pool.nodes)
            if pool.node_template is not None:
                nodes.extend(expand_template(pool.node_template, pool_ordinal=ordinal))
            result.append(PoolHosts(cluster=cluster, pool=pool, nodes=tuple(nodes)))
        return result

    def host_pools(self) -> list[PoolHosts]:
        return [p for p in self.pools() if p.pool.shape is not PoolShape.KUBERNETES]
