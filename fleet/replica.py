"""ModelReplica: one placed replica of a ModelDeployment, in Modelplane's shape.

Replicas are observed state: the fleet scheduler reads every replica of every deployment to know what is already
placed and what each one was charged. Only the fields it reads are modelled; everything else a live object carries
(pod templates, serving, status) is ignored, so replicas copied out of a cluster with `kubectl get -o yaml` load as
they are. `berth plan` writes new replicas in this same shape, so a plan can be fed back in as input.

The ledger charges a replica at the cost it was stamped with (its `deviceRequests`), not at what the current spec
would cost: a member without device requests claims nothing and costs no nodes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt
from pydantic.alias_generators import to_camel

from fleet.deployment import Role, WorkerSpec, member_pods
from fleet.meta import ObjectMeta

DEPLOYMENT_LABEL = "modelplane.ai/deployment"
CLUSTER_LABEL = "modelplane.ai/cluster"
INDEX_LABEL = "modelplane.ai/replica-index"


class Observed(BaseModel):
    """Base for observed objects: camelCase, frozen, and fields Berth does not read are ignored, not refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class ReplicaSelector(Observed):
    cel: str


class ReplicaDeviceRequest(Observed):
    """A resolved, claimable request: what each of the member's pods claims through its ResourceClaim."""

    name: str
    count: NonNegativeInt = 1
    selectors: list[ReplicaSelector] = Field(default_factory=list)
    device_class_name: str | None = None
    device: str | None = Field(default=None, description="Berth: the InferenceClass device the request resolved to.")


class ReplicaMember(Observed):
    role: Role = Role.STANDALONE
    worker: WorkerSpec | None = None
    node_pool_name: str | None = Field(default=None, description="The pool the member is pinned to.")
    device_requests: list[ReplicaDeviceRequest] = Field(default_factory=list)
    nodes: int | None = Field(
        default=None, description="Berth: nodes each copy spans when the resource fit (seed 001) spread it out."
    )

    @property
    def pods(self) -> int:
        return (
            self.nodes if self.nodes is not None else member_pods(self.role, self.worker.nodes if self.worker else None)
        )


class ReplicaEngine(Observed):
    name: str
    copies: int = 1
    members: list[ReplicaMember] = Field(default_factory=list)


class ModelReplicaSpec(Observed):
    cluster_name: str | None = None
    engines: list[ReplicaEngine] = Field(default_factory=list)


class ModelReplica(Observed):
    api_version: str
    kind: Literal["ModelReplica"]
    metadata: ObjectMeta
    spec: ModelReplicaSpec = Field(default_factory=ModelReplicaSpec)

    @property
    def deployment(self) -> str | None:
        return self.metadata.labels.get(DEPLOYMENT_LABEL)

    @property
    def cluster(self) -> str | None:
        return self.spec.cluster_name or self.metadata.labels.get(CLUSTER_LABEL)

    @property
    def index(self) -> int:
        """The per-cluster index label; a replica without one (or with a malformed one) is index 0, as in
        Modelplane, where such replicas predate the label and were alone on their cluster."""
        raw = self.metadata.labels.get(INDEX_LABEL, "0")
        return int(raw) if raw.isdigit() else 0


def stamped_member_cost(member: ReplicaMember, copies: int) -> int:
    """Nodes a placed member holds: pods x copies when it claims devices, else 0 (it rides on its gang's nodes)."""
    return member.pods * copies if member.device_requests else 0
