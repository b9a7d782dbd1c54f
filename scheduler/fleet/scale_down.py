"""Rule 3: while more replicas are kept than wanted, drop one at a time the replica with the largest (replicas of
this deployment on its cluster, cluster name, index): the most loaded cluster first, then the later name, then the
highest index. Removing only at the margin keeps spread (no cluster loses its last replica while another holds two)
and leaves the survivors' indices dense."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.replica import ModelReplica
from scheduler.fleet.results import DroppedReplica, DropReason


@dataclass(frozen=True)
class ScaleDown:
    kept: list[ModelReplica]
    dropped: list[DroppedReplica]


def scale_down(kept: Sequence[ModelReplica], desired: int) -> ScaleDown:
    by_cluster: dict[str, list[ModelReplica]] = {}
    for replica in sorted(kept, key=lambda r: r.index):
        by_cluster.setdefault(replica.cluster or "", []).append(replica)
    excess = len(kept) - desired
    dropped: list[DroppedReplica] = []
    while excess > 0:
        cluster = max(by_cluster, key=lambda name: (len(by_cluster[name]), name))
        victim = by_cluster[cluster].pop()
        if not by_cluster[cluster]:
            del by_cluster[cluster]
        dropped.append(
            DroppedReplica(
                name=victim.metadata.name,
                cluster=cluster,
                index=victim.index,
                reason=DropReason.SCALED_DOWN,
                message=f"scaled down to {desired} replica{'s' if desired != 1 else ''}",
            )
        )
        excess -= 1
    victims = {d.name for d in dropped}
    return ScaleDown(kept=[r for r in kept if r.metadata.name not in victims], dropped=dropped)
