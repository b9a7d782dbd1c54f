"""Rule 2: which existing replicas of this deployment keep their place: a replica is never moved to improve the
picture, so placement does not flip-flop (docs/seeds.md, "Existing replicas keep their place").

A replica is kept while its cluster still exists for this deployment (present, and still matching clusterSelector,
as Modelplane only ever sees selected clusters), carries no NoExecute taint the deployment does not tolerate (nor
runs a pod on a node with one its pod does not tolerate, as the cluster driver observed: `evicted`), still
has the deployment's engines with the same member roles, and every member's pinned pool still exists and still
satisfies the member as the spec now reads (an edited nodeSelector re-places the replica, as an edited pod template
rolls a Deployment). Readiness and capacity are not checked: a degraded cluster keeps its replicas, and a retained
replica is never evicted for space. Of two replicas claiming one (cluster, index), the first by name is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contracts.fleet_plan import DroppedReplica, DropReason
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica, ReplicaEngine
from scheduler.deployment import tolerations
from scheduler.deployment.demand import Demand
from scheduler.deployment.matching import Matcher
from scheduler.deployment.pools import Pool


@dataclass(frozen=True)
class Retention:
    kept: list[ModelReplica]
    dropped: list[DroppedReplica]


def retain(
    demand: Demand,
    ours: Sequence[ModelReplica],
    clusters: Mapping[str, InferenceCluster],
    selected: Mapping[str, tuple[Pool, ...]],
    matcher: Matcher,
    evicted: Mapping[str, str] | None = None,
) -> Retention:
    """`ours` must be sorted by name; `selected` holds the pools of the clusters that match clusterSelector;
    `evicted`: `<namespace>/<replica>` -> why, for replicas with a pod on a node tainted NoExecute."""
    kept: list[ModelReplica] = []
    dropped: list[DroppedReplica] = []
    holders: dict[tuple[str, int], str] = {}
    for replica in ours:
        why = (evicted or {}).get(f"{replica.namespace}/{replica.metadata.name}")
        problem = (
            (DropReason.NO_EXECUTE_TAINT, why)
            if why
            else _problem(replica, demand, clusters, selected, matcher, holders)
        )
        if problem is None:
            holders[(replica.cluster or "", replica.index)] = replica.metadata.name
            kept.append(replica)
        else:
            reason, message = problem
            dropped.append(
                DroppedReplica(
                    name=replica.metadata.name,
                    cluster=replica.cluster,
                    index=replica.index,
                    reason=reason,
                    message=message,
                )
            )
    return Retention(kept=kept, dropped=dropped)


def _problem(
    replica: ModelReplica,
    demand: Demand,
    clusters: Mapping[str, InferenceCluster],
    selected: Mapping[str, tuple[Pool, ...]],
    matcher: Matcher,
    holders: Mapping[tuple[str, int], str],
) -> tuple[DropReason, str] | None:
    name = replica.cluster
    if name is None or name not in clusters:
        return DropReason.CLUSTER_GONE, f"cluster {name} no longer exists"
    if name not in selected:
        return DropReason.CLUSTER_NOT_SELECTED, f"cluster {name} no longer matches clusterSelector"
    evicting = tolerations.untolerated(clusters[name].spec.taints, demand.tolerations, tolerations.EVICTS)
    if evicting:
        return DropReason.NO_EXECUTE_TAINT, f"cluster {name} has untolerated taint {tolerations.describe(evicting)}"
    holder = holders.get((name, replica.index))
    if holder is not None:
        return DropReason.DUPLICATE_INDEX, f"replica {holder} already holds index {replica.index} on cluster {name}"
    return _engines_problem(replica.spec.engines, demand, {p.name: p for p in selected[name]}, matcher)


def _engines_problem(
    observed: Sequence[ReplicaEngine], demand: Demand, pools: Mapping[str, Pool], matcher: Matcher
) -> tuple[DropReason, str] | None:
    wanted = {engine.name: engine for engine in demand.engines}
    if sorted(e.name for e in observed) != sorted(wanted):
        have = ", ".join(e.name for e in observed) or "none"
        return DropReason.ENGINES_CHANGED, f"the replica has engines {have}; the deployment has {', '.join(wanted)}"
    for placed in observed:
        engine = wanted[placed.name]
        roles = [str(m.role) for m in placed.members]
        if roles != [str(m.role) for m in engine.members]:
            return DropReason.ENGINES_CHANGED, f"engine {engine.name}: member roles {', '.join(roles)} changed"
        claims = False
        for pinned, member in zip(placed.members, engine.members, strict=True):
            pool = pools.get(pinned.node_pool_name or "")
            if pool is None:
                return (
                    DropReason.POOL_GONE,
                    f"engine {engine.name} {member.label}: pool {pinned.node_pool_name} is gone",
                )
            fit = matcher.member(engine, member, pool.class_name)
            if isinstance(fit, str):
                return (
                    DropReason.POOL_NO_LONGER_MATCHES,
                    f"engine {engine.name} {member.label} on pool {pool.name}: {fit}",
                )
            claims = claims or bool(fit.claims)
        if not claims:
            return DropReason.POOL_NO_LONGER_MATCHES, f"engine {engine.name}: no member claims a DRA device any more"
    return None
