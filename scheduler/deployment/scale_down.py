"""Rule 3: while more replicas are kept than wanted, drop one at a time the replica with the largest (replicas of
this deployment on its cluster, cluster name, index): the most loaded cluster first, then the later name, then the
highest index. Removing only at the margin keeps spread (no cluster loses its last replica while another holds two)
and leaves the survivors' indices dense.

With the deployment's `scaleDownOrder: Health` (GPUStack's order: docs/seeds.md, "Scale-down by health"), replicas
in error go first, then those still starting, then ready ones (`ModelReplica.health`, from its status conditions);
among replicas of equal health, the rule above, with each cluster's load counted over every kept replica."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.fleet_plan import DroppedReplica, DropReason
from fleet.deployment import ScaleDownOrder
from fleet.replica import ModelReplica, ReplicaHealth

HEALTH_FIRST = (ReplicaHealth.ERROR, ReplicaHealth.STARTING, ReplicaHealth.READY)


@dataclass(frozen=True)
class ScaleDown:
    kept: list[ModelReplica]
    dropped: list[DroppedReplica]


def scale_down(
    kept: Sequence[ModelReplica], desired: int, order: ScaleDownOrder = ScaleDownOrder.MODELPLANE
) -> ScaleDown:
    by_cluster: dict[str, list[ModelReplica]] = {}
    for replica in sorted(kept, key=lambda r: r.index):
        by_cluster.setdefault(replica.cluster or "", []).append(replica)
    excess = len(kept) - desired
    dropped: list[DroppedReplica] = []
    plural = "s" if desired != 1 else ""
    while excess > 0:
        candidates = [r for replicas in by_cluster.values() for r in replicas]
        health = None
        if order is ScaleDownOrder.HEALTH:
            health = min((r.health for r in candidates), key=HEALTH_FIRST.index)
            candidates = [r for r in candidates if r.health is health]
        victim = max(candidates, key=lambda r: (len(by_cluster[r.cluster or ""]), r.cluster or "", r.index))
        cluster = victim.cluster or ""
        by_cluster[cluster].remove(victim)
        if not by_cluster[cluster]:
            del by_cluster[cluster]
        message = f"scaled down to {desired} replica{plural}"
        if health is not None:
            message += f" ({health.value} replicas first)"
        dropped.append(
            DroppedReplica(
                name=victim.metadata.name,
                cluster=cluster,
                index=victim.index,
                reason=DropReason.SCALED_DOWN,
                message=message,
            )
        )
        excess -= 1
    victims = {d.name for d in dropped}
    return ScaleDown(kept=[r for r in kept if r.metadata.name not in victims], dropped=dropped)
