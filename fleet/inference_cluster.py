"""InferenceCluster: a cluster and its node pools, in Modelplane's shape, extended for GPU-as-a-service.

Modelplane's part: `metadata.labels`, `spec.taints`, `spec.nodePools[]` (`name`, `className`, `nodeCount`) and the
observed `status` (conditions, gateway address, gpuPools) its fleet scheduler reads. Berth's part: the cluster's
`region`, each pool's capacity `shape` and GPU product, and for slice and bare-metal pools the hosts themselves.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleet.deadlines import PoolDeadlines
from fleet.meta import Name, ObjectMeta, Spec
from fleet.node import Node, NodeTemplate


class PoolShape(StrEnum):
    GPU_SLICE = "gpu_slice"  # VMs cut from per-slot bundles
    BAREMETAL = "baremetal"  # whole hosts
    KUBERNETES = "kubernetes"  # serves ModelDeployments only; counted in nodes, not slots


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Taint(Spec):
    key: str
    value: str | None = None
    effect: TaintEffect


class NodePool(Spec):
    name: Name
    class_name: Name
    node_count: int | None = Field(
        default=None, description="Nodes in the pool; derived from the hosts for slice and bare-metal pools."
    )
    shape: PoolShape = PoolShape.KUBERNETES
    gpu_product: str | None = Field(default=None, description="Product name used for requests and prices, e.g. H200.")
    nodes: list[Node] = Field(default_factory=list)
    node_template: NodeTemplate | None = None
    deadlines: PoolDeadlines | None = Field(
        default=None, description="Berth: per-state deadlines of allocations on this pool (slice and bare metal)."
    )

    @model_validator(mode="after")
    def _hosts_match_shape(self) -> NodePool:
        has_hosts = bool(self.nodes) or self.node_template is not None
        if self.shape is PoolShape.KUBERNETES and has_hosts:
            raise ValueError("a kubernetes pool lists no hosts: give nodeCount, or set shape to gpu_slice or baremetal")
        if self.shape is not PoolShape.KUBERNETES and not self.gpu_product:
            raise ValueError(f"a {self.shape.value} pool needs gpuProduct (for example H200)")
        if self.shape is PoolShape.KUBERNETES and self.deadlines is not None:
            raise ValueError("deadlines apply to allocations: only gpu_slice and baremetal pools take them")
        return self


class Condition(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: str
    status: str


class Gateway(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    address: str | None = None


class GpuPoolStatus(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    nodes: int | None = None
    devices: Any = None  # Modelplane publishes a list of devices here; Berth reads devices from the pool's class


class ClusterStatus(BaseModel):
    """Observed state, as Modelplane's controllers write it. Optional: without it Berth derives readiness itself."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=None)

    conditions: list[Condition] = Field(default_factory=list)
    gateway: Gateway | None = None
    gpu_pools: list[GpuPoolStatus] = Field(default_factory=list, alias="gpuPools")

    @property
    def ready(self) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in self.conditions)


class InferenceClusterSpec(Spec):
    region: Name | None = Field(default=None, description="Berth region; required for slice and bare-metal pools.")
    taints: list[Taint] = Field(default_factory=list)
    node_pools: list[NodePool] = Field(default_factory=list)

    @model_validator(mode="after")
    def _region_for_hosts(self) -> InferenceClusterSpec:
        if self.region is None and any(p.shape is not PoolShape.KUBERNETES for p in self.node_pools):
            raise ValueError("a cluster with gpu_slice or baremetal pools needs a region")
        return self


class InferenceCluster(Spec):
    api_version: str
    kind: Literal["InferenceCluster"]
    metadata: ObjectMeta
    spec: InferenceClusterSpec
    status: ClusterStatus | None = None
