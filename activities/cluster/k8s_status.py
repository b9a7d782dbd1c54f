"""What Kubernetes objects say, read as Berth needs it: pure functions over JSON as the API server returns it.

- Pools: a node counts toward its pool (label `modelplane.ai/pool`) only if it can take work now: its Ready
  condition is True, no problem condition is True (node-problem-detector's convention, and Kubernetes' pressure
  conditions: any condition but Ready says a problem when True, e.g. a GPU health check's `GpuUnhealthy` or NPD's
  `KernelDeadlock`), it is not cordoned (`spec.unschedulable`), and it has no NoSchedule or NoExecute taint the
  cluster's workloads do not tolerate (the GPU operator's and NPD's health taints included; Modelplane #104:
  cordoned nodes counted as capacity). Every node left out is named with why.
- Evictions: a replica with a pod on a node tainted NoExecute that the pod does not tolerate (its own
  `spec.tolerations`, as Kubernetes' taint manager judges it) is to be moved: the deployment deletes it and
  creates it again where it fits. A pool the autoscaler grows is counted as the nodes that exist, and the message says so
  (Modelplane #139): nodes it has not created yet are not capacity.
- Readiness: a Deployment is ready when its controller has seen the latest spec and every replica is available; a
  LeaderWorkerSet when every group is ready (`status.readyReplicas`). A ResourceClaimTemplate has no status.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from activities.cluster.workload import POOL_LABEL
from contracts.cluster import PoolObservation
from contracts.manifest import Toleration
from fleet.inference_cluster import Taint
from scheduler.deployment.tolerations import BLOCKS_NEW, EVICTS, describe, untolerated

Manifest = dict[str, Any]

# Taints the node lifecycle controller sets; they mirror NotReady and cordoned, which are reported as such.
_LIFECYCLE_TAINTS = {
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/unschedulable",
}


def node_problem(node: Manifest, tolerations: list[Toleration]) -> str | None:
    """Why the node cannot take work now, or None when it can."""
    conditions = {c.get("type"): c for c in (node.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready")
    if ready is None or ready.get("status") != "True":
        reason = (ready or {}).get("reason") or "no Ready condition"
        return f"NotReady ({reason})"
    for kind, condition in sorted(conditions.items(), key=lambda item: str(item[0])):
        if kind != "Ready" and condition.get("status") == "True":
            said = ": ".join(part for part in (condition.get("reason"), condition.get("message")) if part)
            return f"condition {kind}" + (f" ({said})" if said else "")
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    taints = [
        Taint.from_api(taint)
        for taint in spec.get("taints") or []
        if taint.get("effect") in BLOCKS_NEW and taint.get("key") not in _LIFECYCLE_TAINTS
    ]
    blocking = untolerated(taints, tolerations, BLOCKS_NEW)
    return f"tainted {describe(blocking[:1])}" if blocking else None


def observe_pools(
    nodes: list[Manifest], tolerations: list[Toleration], autoscaled: dict[str, int | None] | None = None
) -> list[PoolObservation]:
    """Per pool label value, sorted by name; `autoscaled` names the pools that grow (pool -> maxNodeCount), which
    are listed even when no node of theirs exists yet."""
    autoscaled = autoscaled or {}
    members: dict[str, list[Manifest]] = {name: [] for name in autoscaled}
    for node in nodes:
        pool = ((node.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
        if pool:
            members.setdefault(pool, []).append(node)
    pools = []
    for name in sorted(members):
        excluded = []
        for node in members[name]:
            problem = node_problem(node, tolerations)
            if problem is not None:
                excluded.append(f"{node['metadata']['name']}: {problem}")
        total, schedulable = len(members[name]), len(members[name]) - len(excluded)
        message = f"{schedulable} of {total} node(s) can take work"
        if name in autoscaled:
            ceiling = autoscaled[name]
            message += (
                f"; autoscaled pool (maxNodeCount {ceiling}): counting the {total} node(s) that exist, not the ones "
                "the autoscaler has yet to create"
                if ceiling is not None
                else f"; autoscaled pool: counting the {total} node(s) that exist"
            )
        pools.append(
            PoolObservation(
                name=name,
                nodes=total,
                schedulable=schedulable,
                autoscaled=name in autoscaled,
                excluded=excluded,
                message=message,
            )
        )
    return pools


def evictions(nodes: list[Manifest], pods: list[Manifest], label: str) -> dict[str, str]:
    """`<namespace>/<replica>` -> why, for each replica (its pods carry `label`) with a pod on a node tainted
    NoExecute that the pod does not tolerate."""
    taints = {
        (n.get("metadata") or {}).get("name"): [
            Taint.from_api(t) for t in (n.get("spec") or {}).get("taints") or [] if t.get("effect") in EVICTS
        ]
        for n in nodes
    }
    found: dict[str, str] = {}
    for pod in sorted(pods, key=lambda p: ((p.get("metadata") or {}).get("namespace", ""), p["metadata"]["name"])):
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        replica, node = (meta.get("labels") or {}).get(label), spec.get("nodeName")
        key = f"{meta.get('namespace', 'default')}/{replica}"
        if not replica or not node or key in found:
            continue
        evicting = untolerated(taints.get(node, []), _tolerations(spec), EVICTS)
        if evicting:
            found[key] = f"its pod {meta['name']} runs on node {node}, tainted {describe(evicting[:1])}"
    return found


def _tolerations(pod_spec: Manifest) -> list[Toleration]:
    """The pod's tolerations as Berth's model reads them (`tolerationSeconds` only delays an eviction: left out)."""
    found = []
    for raw in pod_spec.get("tolerations") or []:
        try:
            found.append(Toleration.model_validate({k: v for k, v in raw.items() if k != "tolerationSeconds"}))
        except ValueError:
            continue  # one the API server would have refused (an Equal without a key): it tolerates nothing
    return found


class ObjectReadiness(BaseModel):
    model_config = ConfigDict(frozen=True)

    ready: bool
    pods_ready: int
    pods_total: int
    message: str


def object_readiness(obj: Manifest) -> ObjectReadiness | None:
    """Readiness of a Deployment or LeaderWorkerSet from its status; None for kinds without one (claim templates)."""
    kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    current = generation is None or (status.get("observedGeneration") or 0) >= generation
    wanted = spec.get("replicas", 1)
    if kind == "Deployment":
        available = status.get("availableReplicas") or 0
        ready = current and available >= wanted and (status.get("updatedReplicas") or 0) >= wanted
        return ObjectReadiness(
            ready=ready,
            pods_ready=min(available, wanted),
            pods_total=wanted,
            message=f"Deployment {name}: {available}/{wanted} available",
        )
    if kind == "LeaderWorkerSet":
        size = (spec.get("leaderWorkerTemplate") or {}).get("size", 1)
        groups = status.get("readyReplicas") or 0
        return ObjectReadiness(
            ready=current and groups >= wanted,
            pods_ready=min(groups, wanted) * size,
            pods_total=wanted * size,
            message=f"LeaderWorkerSet {name}: {groups}/{wanted} group(s) of {size} ready",
        )
    return None
