"""The Kubernetes objects one replica's workload becomes: a pure function from `Workload` to manifests.

Why these kinds: a Standalone engine is a set of interchangeable pods, so a Deployment (strategy Recreate, since a
surge pod would need devices the ledger never charged); a Leader with Workers is a gang that must start, restart
and be scheduled together, which is what a LeaderWorkerSet is for (one group per copy, `size` = the leader plus
every worker pod). Each member that claims devices gets a ResourceClaimTemplate (`resource.k8s.io/v1`), so every
pod gets its own claim and DRA admission on the cluster decides which devices it gets; the ledger decided only how
many nodes of which pool. Every pod is pinned with `nodeSelector: {modelplane.ai/pool: <pool>}`; a member with no
device request claims nothing and rides along on its engine's pool.

Every object and every pod carries the replica's labels (`modelplane.ai/replica`, `/deployment`, `/cluster`,
`/replica-index`, `/engine`, and `app.kubernetes.io/managed-by: berth`), which is how the driver finds them again
to read readiness and to delete them; the member's pod template is carried through with only Berth's fields
merged in (labels, the pool pin, the claim and its use by every container, and the deployment's tolerations after
the template's own, leaving out any equal to one the template already has).
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

from activities.cluster.workload import POOL_LABEL, Pod, ResourceClaim, Workload, WorkloadNotRenderable
from contracts.manifest import Role, Toleration

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "berth"
REPLICA_LABEL = "modelplane.ai/replica"
ENGINE_LABEL = "modelplane.ai/engine"
MEMBER_LABEL = "modelplane.ai/member"
CLAIM_NAME = "berth-devices"  # the pod-level name of the claim every container of a claiming pod uses
# What a member without a pod template runs (Berth takes such members; Modelplane's XRD requires a template): a
# pod that holds its pool place and devices and serves nothing.
PLACEHOLDER_CONTAINER = {"name": "engine", "image": "registry.k8s.io/pause:3.10"}

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
DRA_API_VERSION = "resource.k8s.io/v1"

Manifest = dict[str, Any]


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label from the parts; too long, it keeps its start and ends in a hash of the whole, so two long
    names stay distinct (names end up in pod names and label values, both capped at 63)."""
    raw = "-".join(parts).lower()
    name = re.sub(r"[^a-z0-9-]+", "-", raw).strip("-") or "x"
    if len(name) <= limit and name == raw:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def replica_labels(workload: Workload) -> dict[str, str]:
    """Labels every object and pod of the replica carries: the replica's own (deployment, cluster, index, the
    template's labels) plus the replica name and the field manager."""
    return {**workload.labels, REPLICA_LABEL: workload.name, MANAGED_BY_LABEL: MANAGER}


def render_objects(workload: Workload) -> list[Manifest]:
    """Every object of the replica, claim templates first (a pod naming a missing template stays Pending)."""
    claims: list[Manifest] = []
    workloads: list[Manifest] = []
    engines: dict[str, list[Pod]] = {}
    for pod in workload.pods:
        engines.setdefault(pod.engine, []).append(pod)
    for engine, pods in engines.items():
        pool = next((p.node_selector.get(POOL_LABEL) for p in pods if p.node_selector.get(POOL_LABEL)), "")
        gang = [p for p in pods if p.role in (Role.LEADER, Role.WORKER)]
        if gang:
            claims.extend(_claim_templates(workload, engine, gang))
            workloads.append(_leader_worker_set(workload, engine, gang, pool))
        for member_index in sorted({p.member_index for p in pods if p.role == Role.STANDALONE}):
            members = [p for p in pods if p.role == Role.STANDALONE and p.member_index == member_index]
            claims.extend(_claim_templates(workload, engine, members))
            workloads.append(_deployment(workload, engine, members, pool))
    return claims + workloads


# -- claims ---------------------------------------------------------------------------------------------------------


def claim_template_name(workload: Workload, pod: Pod) -> str:
    return dns_name(workload.name, pod.engine, f"m{pod.member_index}", "devices", limit=253)


def _claim_templates(workload: Workload, engine: str, pods: list[Pod]) -> list[Manifest]:
    first: dict[int, Pod] = {}
    for pod in pods:
        if pod.resource_claim is not None:
            first.setdefault(pod.member_index, pod)
    return [
        {
            "apiVersion": DRA_API_VERSION,
            "kind": "ResourceClaimTemplate",
            "metadata": _metadata(workload, claim_template_name(workload, pod), engine, pod.member_index),
            "spec": {"spec": {"devices": {"requests": _requests(pod.resource_claim)}}},
        }
        for pod in first.values()
        if pod.resource_claim is not None
    ]


def _requests(claim: ResourceClaim) -> list[Manifest]:
    requests = []
    for request in claim.requests:
        exactly: Manifest = {
            "deviceClassName": request.device_class_name,
            "allocationMode": "ExactCount",
            "count": request.count,
        }
        if request.selectors:
            exactly["selectors"] = [{"cel": {"expression": cel}} for cel in request.selectors]
        requests.append({"name": dns_name(request.name), "exactly": exactly})
    return requests


# -- workloads ------------------------------------------------------------------------------------------------------


def _deployment(workload: Workload, engine: str, pods: list[Pod], pool: str) -> Manifest:
    first = pods[0]
    name = dns_name(workload.name, engine, f"m{first.member_index}")
    selector = {REPLICA_LABEL: workload.name, ENGINE_LABEL: dns_name(engine), MEMBER_LABEL: str(first.member_index)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(workload, name, engine, first.member_index),
        "spec": {
            "replicas": len({p.copy_index for p in pods}),
            "selector": {"matchLabels": selector},
            "strategy": {"type": "Recreate"},
            "template": pod_template(workload, first, pool),
        },
    }


def _leader_worker_set(workload: Workload, engine: str, pods: list[Pod], pool: str) -> Manifest:
    """One group per copy: the leader pod (when the engine has a Leader) and every worker pod of that copy."""
    copies = sorted({p.copy_index for p in pods})
    group = [p for p in pods if p.copy_index == copies[0]]
    leaders = [p for p in group if p.role == Role.LEADER]
    workers = [p for p in group if p.role == Role.WORKER]
    worker = workers[0] if workers else leaders[0]
    distinct = {(p.member_index, p.resource_claim.model_dump_json() if p.resource_claim else "") for p in workers}
    templates = {repr(p.template) for p in workers}
    if len({c for _, c in distinct}) > 1 or len(templates) > 1:
        raise WorkloadNotRenderable(
            f"engine {engine} of {workload.name}: its Worker members differ in pod template or device requests; "
            "a LeaderWorkerSet has one worker template"
        )
    template: Manifest = {"size": len(group), "restartPolicy": "RecreateGroupOnPodRestart"}
    if leaders and workers:
        template["leaderTemplate"] = pod_template(workload, leaders[0], pool)
    template["workerTemplate"] = pod_template(workload, worker, pool)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": _metadata(workload, dns_name(workload.name, engine), engine, None),
        "spec": {"replicas": len(copies), "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template},
    }


def pod_template(workload: Workload, pod: Pod, pool: str) -> Manifest:
    """The member's pod template with Berth's fields merged in; what the member wrote otherwise stays as written
    (Berth's pool pin wins over a nodeSelector the template sets on the same key)."""
    template = copy.deepcopy(pod.template) if pod.template else {}
    metadata = template.setdefault("metadata", {})
    metadata["labels"] = {
        **(metadata.get("labels") or {}),
        **replica_labels(workload),
        ENGINE_LABEL: dns_name(pod.engine),
        MEMBER_LABEL: str(pod.member_index),
    }
    spec = template.setdefault("spec", {})
    if not spec.get("containers"):
        spec["containers"] = [dict(PLACEHOLDER_CONTAINER)]
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), POOL_LABEL: pod.node_selector.get(POOL_LABEL) or pool}
    if workload.tolerations:
        spec["tolerations"] = merged_tolerations(spec.get("tolerations") or [], workload.tolerations)
    if pod.resource_claim is not None:
        claim = {"name": CLAIM_NAME, "resourceClaimTemplateName": claim_template_name(workload, pod)}
        spec["resourceClaims"] = [*(c for c in spec.get("resourceClaims") or [] if c.get("name") != CLAIM_NAME), claim]
        for container in spec["containers"]:
            resources = container.setdefault("resources", {})
            used = [c for c in resources.get("claims") or [] if c.get("name") != CLAIM_NAME]
            resources["claims"] = [*used, {"name": CLAIM_NAME}]
    return template


def merged_tolerations(written: list[Manifest], berth: list[Toleration]) -> list[Manifest]:
    """The template's tolerations as written, then each of the deployment's that none of them already equals."""
    merged = list(written)
    seen = {_toleration_key(t) for t in written}
    for toleration in berth:
        manifest = toleration.manifest()
        if _toleration_key(manifest) not in seen:
            seen.add(_toleration_key(manifest))
            merged.append(manifest)
    return merged


def _toleration_key(toleration: Manifest) -> tuple[object, ...]:
    """Equal as Kubernetes matches them: an unset operator is Equal, an unset key, value or effect is empty."""
    return (
        toleration.get("key") or "",
        toleration.get("operator") or "Equal",
        toleration.get("value") or "",
        toleration.get("effect") or "",
        toleration.get("tolerationSeconds"),
    )


def _metadata(workload: Workload, name: str, engine: str, member_index: int | None) -> Manifest:
    labels = {**replica_labels(workload), ENGINE_LABEL: dns_name(engine)}
    if member_index is not None:
        labels[MEMBER_LABEL] = str(member_index)
    return {"name": name, "namespace": workload.namespace, "labels": labels}
