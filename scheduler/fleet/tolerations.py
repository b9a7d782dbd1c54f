"""Taints and tolerations between a ModelDeployment and an InferenceCluster, with Kubernetes' matching rules.

A NoSchedule taint keeps new replicas off a cluster; a NoExecute taint also evicts the replicas already there.
PreferNoSchedule is a preference, and the fleet scheduler has no preferences, so it never blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fleet.deployment import Toleration
from fleet.inference_cluster import Taint, TaintEffect

BLOCKS_NEW = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})
EVICTS = frozenset({TaintEffect.NO_EXECUTE})


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """A keyless Exists tolerates every taint; Exists with a key any value of that key; Equal the key and value.
    A toleration with an effect covers only that effect, so a NoSchedule toleration leaves NoExecute uncovered."""
    if toleration.effect is not None and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and (toleration.value or None) == (taint.value or None)


def untolerated(
    taints: Iterable[Taint], tolerations: Sequence[Toleration], effects: frozenset[TaintEffect]
) -> list[Taint]:
    return [t for t in taints if t.effect in effects and not any(tolerates(tol, t) for tol in tolerations)]


def describe(taints: Iterable[Taint]) -> str:
    return ", ".join(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in taints)
