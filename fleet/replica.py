"""ModelReplica: one placed replica of a ModelDeployment, in Modelplane's shape (its XRD, field for field).

Replicas are observed state: the fleet scheduler reads every replica of every deployment to know what is already
placed and what each one was charged. Read: the labels, `spec.clusterName`, and per engine `copies` and per member
`role`, `worker.nodes`, `nodePoolName` and `deviceRequests`. Carried: members' pod `template`, `serving`,
`modelCacheRef`, an engine's `phase`, `spec.crossplane`, `status` and any metadata of a live object. A field no XRD
defines is an error, except the two that replicas written by earlier Berth versions carry (`nodes` on a member,
`device` on a request), which are still read.

`berth plan` writes new replicas in this same shape, so a plan can be fed back in as input, and what it writes
validates against Modelplane's ModelReplica XRD: the span of a member that the resource fit (docs/seeds.md,
"Resource fit from a memory need") spread over several nodes, which the XRD has no field for, travels in the
annotation `berth.dev/member-nodes` (`{"<engine>": {"<member index>": nodes}}`).

The ledger charges a replica at the cost it was stamped with (its `deviceRequests`), not at what the current spec
would cost: a member without device requests claims nothing and costs no nodes.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from contracts.manifest import Role
from fleet.deployment import ModelCacheRef, Serving, WorkerSpec, member_pods
from fleet.meta import Carried, ObjectMeta

DEPLOYMENT_LABEL = "modelplane.ai/deployment"
CLUSTER_LABEL = "modelplane.ai/cluster"
INDEX_LABEL = "modelplane.ai/replica-index"
MEMBER_NODES_ANNOTATION = "berth.dev/member-nodes"
MEMBER_GPUS_ANNOTATION = "berth.dev/member-gpus"


class ReplicaHealth(StrEnum):
    ERROR = "error"
    STARTING = "starting"
    READY = "ready"


# Crossplane's condition reasons for a composite that failed (crossplane-runtime's ReasonReconcileError) or was
# available and is no longer (ReasonUnavailable); `Creating` and `Deleting` are neither.
ERROR_REASONS = frozenset({"ReconcileError", "Unavailable"})


def ready_status(ready: bool) -> dict[str, Any]:
    """The `status` Berth writes on the replicas it records: Ready True once its workload is ready, else Creating."""
    condition = (
        {"type": "Ready", "status": "True", "reason": "Available"}
        if ready
        else {"type": "Ready", "status": "False", "reason": "Creating"}
    )
    return {"conditions": [condition]}


class Observed(BaseModel):
    """Base for observed objects: camelCase, frozen; a field the XRD does not define is refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ReplicaSelector(Observed):
    cel: str


class ReplicaDeviceRequest(Observed):
    """A resolved, claimable request: what each of the member's pods claims through its ResourceClaim."""

    name: str
    count: NonNegativeInt = 1
    selectors: list[ReplicaSelector] = Field(default_factory=list)
    device_class_name: str | None = None
    device: str | None = Field(
        default=None, exclude=True, description="Read from replicas earlier Berth versions wrote; never written."
    )


class MemberGpus(Observed):
    """The pool's node (by the ledger's number) each pod's GPUs were charged on (docs/seeds.md, "GPU-level fit")."""

    device: str = Field(min_length=1, description="The InferenceClass device the pods claim.")
    nodes: list[NonNegativeInt] = Field(description="One node number per pod, copies after one another.")


class ReplicaMember(Observed):
    role: Role = Role.STANDALONE
    worker: WorkerSpec | None = None
    node_pool_name: str | None = Field(default=None, description="The pool the member is pinned to.")
    device_requests: list[ReplicaDeviceRequest] = Field(
        default_factory=list, description="Written only when non-empty: the XRD has it absent, never empty."
    )
    template: Carried | None = Field(default=None, description="The deployment member's pod template; carried.")
    nodes: int | None = Field(
        default=None,
        exclude=True,
        description="Berth: nodes each copy spans when the resource fit spread it over several nodes; written as the "
        "berth.dev/member-nodes annotation.",
    )
    gpus: MemberGpus | None = Field(
        default=None,
        exclude=True,
        description="Berth: charged by GPU, not by node (fitGranularity Gpu); written as the berth.dev/member-gpus "
        "annotation.",
    )

    @property
    def pods(self) -> int:
        return (
            self.nodes if self.nodes is not None else member_pods(self.role, self.worker.nodes if self.worker else None)
        )


class ReplicaEngine(Observed):
    name: str
    copies: int = 1
    phase: Literal["Prefill", "Decode"] | None = None
    members: list[ReplicaMember] = Field(default_factory=list)


class ModelReplicaSpec(Observed):
    crossplane: Carried | None = None
    cluster_name: str | None = None
    model_cache_ref: ModelCacheRef | None = None
    serving: Serving | None = None
    engines: list[ReplicaEngine] = Field(default_factory=list)


class ModelReplica(Observed):
    api_version: str
    kind: Literal["ModelReplica"]
    metadata: ObjectMeta
    spec: ModelReplicaSpec = Field(default_factory=ModelReplicaSpec)
    status: Carried | None = None

    @model_validator(mode="before")
    @classmethod
    def _members_from_annotations(cls, data: Any) -> Any:
        """Put the berth.dev/member-nodes and berth.dev/member-gpus annotations back on the members they describe."""
        if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict):
            return data  # built in code, not read from a document: the members carry their spans themselves
        annotations = data["metadata"].get("annotations") or {}
        spec = data.get("spec")
        if not isinstance(annotations, dict) or not isinstance(spec, dict) or not isinstance(spec.get("engines"), list):
            return data
        given: dict[str, Any] = {}
        for field, annotation in (("nodes", MEMBER_NODES_ANNOTATION), ("gpus", MEMBER_GPUS_ANNOTATION)):
            raw = annotations.get(annotation)
            if not raw:
                continue
            try:
                given[field] = json.loads(raw)
            except ValueError:
                raise ValueError(f"metadata.annotations[{annotation}] is not JSON") from None
            if not isinstance(given[field], dict):
                raise ValueError(f"metadata.annotations[{annotation}] is not a JSON object")
        if not given:
            return data
        engines = []
        for engine in spec["engines"]:
            if isinstance(engine, dict) and isinstance(engine.get("members"), list):
                members = []
                for i, member in enumerate(engine["members"]):
                    if isinstance(member, dict):
                        for field, by_engine in given.items():
                            value = (by_engine.get(engine.get("name")) or {}).get(str(i))
                            if value is not None:
                                member = {**member, field: value}
                    members.append(member)
                engine = {**engine, "members": members}
            engines.append(engine)
        return {**data, "spec": {**spec, "engines": engines}}

    @model_serializer(mode="wrap")
    def _member_nodes_to_annotation(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Members' spans leave the spec (the XRD has no field for them) for the berth.dev/member-nodes annotation."""
        data: dict[str, Any] = handler(self)
        for engine in (data.get("spec") or {}).get("engines") or []:
            for member in engine.get("members") or []:
                if member.get("deviceRequests") == []:
                    del member["deviceRequests"]
        spans = {
            engine.name: {str(i): m.nodes for i, m in enumerate(engine.members) if m.nodes is not None}
            for engine in self.spec.engines
        }
        gpus = {
            engine.name: {
                str(i): m.gpus.model_dump(mode="json") for i, m in enumerate(engine.members) if m.gpus is not None
            }
            for engine in self.spec.engines
        }
        if not self.metadata.annotations:
            (data.get("metadata") or {}).pop("annotations", None)
        for annotation, by_engine in ((MEMBER_NODES_ANNOTATION, spans), (MEMBER_GPUS_ANNOTATION, gpus)):
            by_engine = {name: given for name, given in by_engine.items() if given}
            if by_engine:
                metadata = data.setdefault("metadata", {})
                metadata["annotations"] = {
                    **(metadata.get("annotations") or {}),
                    annotation: json.dumps(by_engine, sort_keys=True),
                }
        return data

    @property
    def namespace(self) -> str:
        return self.metadata.namespace_or_default

    @property
    def deployment(self) -> str | None:
        return self.metadata.labels.get(DEPLOYMENT_LABEL)

    @property
    def cluster(self) -> str | None:
        return self.spec.cluster_name or self.metadata.labels.get(CLUSTER_LABEL)

    @property
    def health(self) -> ReplicaHealth:
        """From `status.conditions`, as a Crossplane composite (Modelplane's ModelReplica) publishes them: `Ready`
        True is ready; a `Synced` or `Ready` condition False with an error reason (`ReconcileError`, `Unavailable`)
        is in error; anything else (no condition yet, `Ready` False while `Creating`, Unknown) is still starting. A
        replica with no `status` at all, as written in a file for `berth plan`, is taken as ready: it says nothing is
        wrong (Berth's own replicas always carry their readiness)."""
        if self.status is None:
            return ReplicaHealth.READY
        conditions = self.status.get("conditions") or []
        by_type = {c.get("type"): c for c in conditions if isinstance(c, dict)}
        if any(
            by_type.get(kind, {}).get("status") == "False" and by_type[kind].get("reason") in ERROR_REASONS
            for kind in ("Synced", "Ready")
        ):
            return ReplicaHealth.ERROR
        if by_type.get("Ready", {}).get("status") == "True":
            return ReplicaHealth.READY
        return ReplicaHealth.STARTING

    @property
    def index(self) -> int:
        """The per-cluster index label; a replica without one (or with a malformed one) is index 0, as in
        Modelplane, where such replicas predate the label and were alone on their cluster."""
        raw = self.metadata.labels.get(INDEX_LABEL, "0")
        return int(raw) if raw.isdigit() else 0


def stamped_member_cost(member: ReplicaMember, copies: int) -> int:
    """Whole nodes a placed member holds: pods x copies when it claims devices, else 0 (it rides on its gang's
    nodes); a GPU-level member holds GPUs of shared nodes instead (`scheduler/deployment/ledger.py` charges them)."""
    return member.pods * copies if member.device_requests and member.gpus is None else 0
