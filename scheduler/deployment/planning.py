"""The fleet scheduler's inputs read as Modelplane reads them, and its status said as Modelplane would say it.

`plan_deployment` is what `berth plan` and the deployment workflow's planning activity call. It stays pure (files
or rows in, a plan out) and wraps `scheduler.deployment.schedule_deployment` with what a Modelplane manifest means:

1. published devices (`status.gpuPools[].devices`) are what pools match against (`fleet/published.py`);
2. a pool that autoscales counts `maxNodeCount` nodes, as Modelplane publishes it, when the status publishes no
   count of its own;
3. `modelCacheRef`: new replicas only where the cache stages, none while it is missing (`fleet/cache.py`);
4. the status message says when placed replicas count nodes the autoscaler has not created yet (Modelplane #139),
   and why nothing new is placed while the cache is missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from contracts.fleet_plan import FleetPlan, Phase, StatusReason
from contracts.vocabulary import PoolShape
from fleet.cache import gate_on_cache
from fleet.deployment import ModelDeployment
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.model_cache import ModelCache
from fleet.published import with_published_devices
from fleet.replica import DEPLOYMENT_LABEL, ModelReplica
from scheduler.deployment import schedule_deployment


def _autoscaled_counts(cluster: InferenceCluster) -> InferenceCluster:
    """Kubernetes pools count maxNodeCount when they autoscale (the status's own count wins when it publishes one)."""
    if not any(p.max_node_count is not None for p in cluster.spec.node_pools):
        return cluster
    pools = [
        p.model_copy(update={"node_count": p.published_nodes})
        if p.max_node_count is not None and p.shape is PoolShape.KUBERNETES
        else p
        for p in cluster.spec.node_pools
    ]
    return cluster.model_copy(update={"spec": cluster.spec.model_copy(update={"node_pools": pools})})


def autoscaler_note(plan: FleetPlan, clusters: Mapping[str, InferenceCluster]) -> str | None:
    """A sentence naming the pools this plan uses whose count includes nodes the autoscaler has yet to create."""
    used = sorted({(r.cluster, e.pool) for r in plan.replicas for e in r.engines if e.pool and e.nodes})
    waiting = []
    for cluster_name, pool_name in used:
        cluster = clusters.get(cluster_name)
        pool = next((p for p in cluster.spec.node_pools if p.name == pool_name), None) if cluster else None
        if pool is not None and pool.autoscaled_nodes:
            waiting.append(
                f"{cluster_name}/{pool_name} ({pool.published_nodes} counted, nodeCount {pool.node_count or 0})"
            )
    if not waiting:
        return None
    return (
        "capacity counts nodes the autoscaler has not created yet (maxNodeCount) in "
        + ", ".join(waiting)
        + "; replicas there wait for them"
    )


def _as_seen_by(deployment: ModelDeployment, replicas: Iterable[ModelReplica]) -> list[ModelReplica]:
    """Replicas of a same-named deployment in another namespace are another deployment's: they hold capacity and
    are never retained, scaled down or re-placed by this one."""
    seen = []
    for replica in replicas:
        if replica.deployment == deployment.metadata.name and replica.namespace != deployment.namespace:
            labels = {**replica.metadata.labels, DEPLOYMENT_LABEL: f"{replica.namespace}/{replica.deployment}"}
            replica = replica.model_copy(update={"metadata": replica.metadata.model_copy(update={"labels": labels})})
        seen.append(replica)
    return seen


def plan_deployment(
    deployment: ModelDeployment,
    clusters: Iterable[InferenceCluster],
    classes: Mapping[str, InferenceClass],
    replicas: Iterable[ModelReplica],
    caches: Mapping[str, ModelCache] | None = None,
    evicted: Mapping[str, str] | None = None,
) -> FleetPlan:
    """Plan one deployment over the fleet as Modelplane would, with Berth's status notes; `evicted` replicas
    (`<namespace>/<name>` -> why: a pod on a node tainted NoExecute) are moved."""
    declared = {c.metadata.name: c for c in clusters}
    effective, effective_classes = with_published_devices([_autoscaled_counts(c) for c in declared.values()], classes)
    gate = gate_on_cache(deployment, effective, caches or {})
    plan = schedule_deployment(
        gate.deployment, gate.clusters, effective_classes, _as_seen_by(deployment, replicas), evicted
    )
    status = plan.status
    if gate.missing is not None:
        message = f"ModelCache {gate.missing} not found; holding replica placement ({status.available} retained)"
        status = status.model_copy(update={"reason": StatusReason.MODEL_CACHE_NOT_FOUND, "message": message})
        if status.phase is Phase.FULLY_SCHEDULED:
            status = status.model_copy(update={"reason": None})
    note = autoscaler_note(plan, declared)
    if note is not None:
        status = status.model_copy(update={"message": f"{status.message}; {note}"})
    return plan.model_copy(update={"status": status})
