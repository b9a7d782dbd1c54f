"""Taints and tolerations, with Kubernetes' matching rules: the one place Berth matches a toleration to a taint.

Two callers: the fleet scheduler, between a ModelDeployment's tolerations and an InferenceCluster's taints, and the
cluster driver, between the taints an InferenceCluster declares and the taints on its nodes as the API server
returns them (read with `Taint.from_api`), to tell which nodes count toward their pool.

A NoSchedule taint keeps new replicas off a cluster; a NoExecute taint also evicts the replicas already there.
PreferNoSchedule is a preference, and the fleet scheduler has no preferences, so it never blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from contracts.manifest import TaintEffect, Toleration
from fleet.inference_cluster import Taint

BLOCKS_NEW = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})
EVICTS = frozenset({TaintEffect.NO_EXECUTE})


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' `ToleratesTaint` (k8s.io/api/core/v1/toleration.go): an effect, when set, must be the taint's (a
    NoSchedule toleration leaves NoExecute uncovered); a key, when set, must be the taint's (so a keyless Exists
    tolerates every taint); then Exists matches any value and Equal the taint's value (unset and empty alike). Any
    other operator tolerates nothing."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.operator == "Equal" and (toleration.value or "") == (taint.value or "")


def untolerated(
    taints: Iterable[Taint], tolerations: Sequence[Toleration], effects: frozenset[TaintEffect]
) -> list[Taint]:
    return [t for t in taints if t.effect in effects and not any(tolerates(tol, t) for tol in tolerations)]


def describe(taints: Iterable[Taint]) -> str:
    return ", ".join(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in taints)
