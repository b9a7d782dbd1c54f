"""The workload one ModelDeployment replica renders to: what a cluster driver applies, as plain pydantic objects.

Rendering is a pure function of the ModelReplica the fleet scheduler stamped: one pod per copy of each Standalone
or Leader member and one per node of each Worker member, every pod pinned to its member's pool through the
`modelplane.ai/pool` node label (Modelplane's pinning: the pool choice is enforced, not advisory, so the per-pool
ledger matches where pods really run), and one DRA ResourceClaim per pod from the member's device requests. The
Kubernetes driver turns these into a Deployment (or a LeaderWorkerSet for a multi-node member) with
ResourceClaimTemplates (activities/cluster/k8s_objects.py); the simulated driver stores them.

The deployment's `spec.template.spec.tolerations` travel on the replica as the `berth.dev/tolerations` annotation
(the ModelReplica XRD has no field for them; written by `replica_manifest`) and land on every pod: they are what
the fleet scheduler checked against the cluster's taints, so the pods must carry them to be admitted on its nodes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from contracts.manifest import DEFAULT_NAMESPACE, Role, Toleration
from fleet.replica import ModelReplica
from scheduler.deployment.manifests import TOLERATIONS_ANNOTATION

POOL_LABEL = "modelplane.ai/pool"
DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"


class WorkloadNotRenderable(ValueError):
    """The replica asks for something Kubernetes objects cannot express; retrying will not help."""


class Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class DeviceClaimRequest(Model):
    """One request of a DRA ResourceClaim: `count` devices of the class, each satisfying every CEL selector."""

    name: str
    device_class_name: str
    count: int
    selectors: list[str] = Field(default_factory=list)


class ResourceClaim(Model):
    name: str
    requests: list[DeviceClaimRequest]


class Pod(Model):
    name: str
    engine: str
    role: Role
    copy_index: int
    member_index: int = 0
    rank: int = 0  # which of the member's pods within one copy (a Worker member has worker.nodes of them)
    node_selector: dict[str, str]  # always pins the pool: {POOL_LABEL: pool}
    resource_claim: ResourceClaim | None = None  # None: the member claims no device and rides along
    template: dict[str, Any] | None = None  # the member's pod template from the ModelDeployment, carried as written


class Workload(Model):
    """Everything one replica runs on its cluster, named after the replica in the replica's namespace (two
    namespaces' replicas may share a name); applying it twice changes nothing."""

    cluster: str
    namespace: str = DEFAULT_NAMESPACE
    name: str
    deployment: str
    replica_index: int
    labels: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(
        default_factory=list, description="The deployment's tolerations, carried onto every pod."
    )
    pods: list[Pod]


def render_workload(replica: ModelReplica) -> Workload:
    """The pods and resource claims of a stamped replica, every pod pinned to its member's pool."""
    name = replica.metadata.name
    pods: list[Pod] = []
    for engine in replica.spec.engines:
        for copy_index in range(engine.copies):
            for member_index, member in enumerate(engine.members):
                pool = member.node_pool_name or ""
                for rank in range(member.pods):
                    pod_name = f"{name}-{engine.name}-{copy_index}-{member.role.value.lower()}-{member_index}-{rank}"
                    claim = None
                    if member.device_requests:
                        claim = ResourceClaim(
                            name=f"{pod_name}-devices",
                            requests=[
                                DeviceClaimRequest(
                                    name=request.name,
                                    device_class_name=request.device_class_name or DEFAULT_DEVICE_CLASS,
                                    count=request.count,
                                    selectors=[s.cel for s in request.selectors],
                                )
                                for request in member.device_requests
                            ],
                        )
                    pods.append(
                        Pod(
                            name=pod_name,
                            engine=engine.name,
                            role=member.role,
                            copy_index=copy_index,
                            member_index=member_index,
                            rank=rank,
                            node_selector={POOL_LABEL: pool},
                            resource_claim=claim,
                            template=_template(member.template),
                        )
                    )
    return Workload(
        cluster=replica.cluster or "",
        namespace=replica.namespace,
        name=name,
        deployment=replica.deployment or "",
        replica_index=replica.index,
        labels=dict(replica.metadata.labels),
        tolerations=_tolerations(replica),
        pods=pods,
    )


_TOLERATIONS = TypeAdapter(list[Toleration])


def _tolerations(replica: ModelReplica) -> list[Toleration]:
    """The deployment's tolerations the replica was stamped with; none for a replica without the annotation."""
    raw = replica.metadata.annotations.get(TOLERATIONS_ANNOTATION)
    if not raw:
        return []
    try:
        return _TOLERATIONS.validate_json(raw)
    except ValidationError as error:
        raise WorkloadNotRenderable(
            f"{replica.metadata.name}: annotation {TOLERATIONS_ANNOTATION} is not a JSON list of tolerations: "
            f"{error.errors()[0]['msg']}"
        ) from None


def _template(carried: object) -> dict[str, Any] | None:
    """The member's pod template as the plain JSON object it was written as."""
    if carried is None:
        return None
    if isinstance(carried, dict):
        return carried
    dump = getattr(carried, "model_dump", None)
    return dump(mode="json", by_alias=True, exclude_none=True) if dump else None
