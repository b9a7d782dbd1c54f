"""What the fleet scheduler returns: the replicas to run, the replicas to remove, and the deployment's status.

These models are the stable output of `berth plan --output json` (camelCase, as Kubernetes objects are), and the
input the deployment workflow acts on. Codes are stable strings a client may branch on; messages are for people.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from contracts.manifest import Role


class FitStep(StrEnum):
    """The resource-fit step a member's device request came from (docs/seeds.md, "Resource fit from a memory need")."""

    ONE_GPU = "OneGpu"
    GPUS_OF_ONE_NODE = "GpusOfOneNode"
    SEVERAL_NODES = "SeveralNodes"
    CPU = "Cpu"

    @property
    def rank(self) -> int:
        """1 for the most preferred step; engines without a memory need rank 0."""
        return list(FitStep).index(self) + 1


class Phase(StrEnum):
    FULLY_SCHEDULED = "FullyScheduled"  # every desired replica has a place
    PARTIALLY_SCHEDULED = "PartiallyScheduled"  # fewer, but at least minReplicas (or at least one without it)
    SCHEDULE_FAILED = "ScheduleFailed"  # below minReplicas, or an invalid selector


class StatusReason(StrEnum):
    INVALID_NODE_SELECTOR = "InvalidNodeSelector"
    NO_CLUSTERS = "NoClusters"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    MODEL_CACHE_NOT_FOUND = "ModelCacheNotFound"  # the referenced ModelCache is missing: nothing new is placed
    NO_SINGLE_CLUSTER = "NoSingleCluster"  # singleCluster: no one cluster holds every replica (or minReplicas)
    NO_SUITABLE_NODE_GROUP = "NoSuitableNodeGroup"  # homogeneous: no node group holds them (KAITO's denial)


class ClusterReason(StrEnum):
    """Why a cluster that matches clusterSelector took no (further) replica."""

    NOT_READY = "NotReady"
    NO_GATEWAY_ADDRESS = "NoGatewayAddress"
    UNTOLERATED_TAINT = "UntoleratedTaint"
    DRAINING = "Draining"  # being deleted, or marked draining (scheduler/deployment/draining.py)
    NO_MATCHING_POOL = "NoMatchingPool"  # some engine fits no pool, whatever the capacity
    INSUFFICIENT_NODES = "InsufficientNodes"  # some engine fits a pool that lacks free nodes


class DropReason(StrEnum):
    """Why an existing replica of this deployment is not kept."""

    CLUSTER_GONE = "ClusterGone"
    CLUSTER_NOT_SELECTED = "ClusterNotSelected"
    NO_EXECUTE_TAINT = "UntoleratedNoExecuteTaint"
    ENGINES_CHANGED = "EnginesChanged"
    POOL_GONE = "PoolGone"
    POOL_NO_LONGER_MATCHES = "PoolNoLongerMatches"
    DUPLICATE_INDEX = "DuplicateIndex"
    SCALED_DOWN = "ScaledDown"
    DRAINED = "Drained"  # its cluster or pool drains and a ready replica elsewhere took its place
    SINGLE_CLUSTER = "SingleCluster"  # singleCluster: the deployment runs on another cluster
    OTHER_NODE_GROUP = "OtherNodeGroup"  # homogeneous: the deployment runs on another node group


class Output(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class RequestPlacement(Output):
    name: str
    count: int
    device: str | None  # the InferenceClass device claimed (unknown for replicas Berth did not place)
    selectors: list[str] = []
    device_class_name: str | None = None  # the DRA DeviceClass it is claimed through


class GpuPlacement(Output):
    """fitGranularity Gpu: the member is charged `perPod` devices on one node per pod, not whole nodes."""

    device: str
    per_pod: int
    nodes: list[int]  # the pool's node (the ledger's number, 0, 1, ...) each pod's devices were charged on


class MemberPlacement(Output):
    role: Role
    pool: str | None
    nodes: int  # whole-node cost: pods x copies when the member claims devices and is not GPU-level, else 0
    device_requests: list[RequestPlacement]
    fit: FitStep | None = None  # the resource-fit step that derived the request (`FitStep`)
    span: int | None = None  # the resource fit's SeveralNodes: nodes one copy spans
    gpus: GpuPlacement | None = None  # docs/seeds.md, "GPU-level fit": the devices it holds of shared nodes


class EnginePlacement(Output):
    name: str
    pool: str | None
    nodes: int  # the engine's node cost on its pool
    members: list[MemberPlacement]


class ReplicaPlacement(Output):
    name: str
    cluster: str
    index: int
    origin: Literal["retained", "new"]
    gateway_address: str | None
    engines: list[EnginePlacement]


class DroppedReplica(Output):
    name: str
    cluster: str | None
    index: int
    reason: DropReason
    message: str


class ClusterVerdict(Output):
    cluster: str
    reason: ClusterReason
    message: str


class SelectorProblem(Output):
    expression: str
    line: int
    column: int
    message: str


class DeploymentStatus(Output):
    desired: int
    min_replicas: int | None
    available: int  # replicas in the plan: retained plus new
    retained: int
    new: int
    phase: Phase
    reason: StatusReason | None
    message: str
    clusters_checked: int  # clusters matching clusterSelector
    clusters: list[ClusterVerdict]  # per cluster, why it took no more; given whenever the plan falls short
    selector_error: SelectorProblem | None = None
    moving: list[str] = Field(
        default_factory=list
    )  # replicas moving off draining capacity (scheduler/deployment/moves.py)


class FleetPlan(Output):
    deployment: str
    replicas: list[ReplicaPlacement]  # retained then new, each group sorted by (cluster, index)
    dropped: list[DroppedReplica]
    status: DeploymentStatus

    @property
    def new(self) -> list[ReplicaPlacement]:
        return [r for r in self.replicas if r.origin == "new"]

    @property
    def retained(self) -> list[ReplicaPlacement]:
        return [r for r in self.replicas if r.origin == "retained"]
