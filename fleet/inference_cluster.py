"""InferenceCluster: a cluster and its node pools, in Modelplane's shape, extended for GPU-as-a-service.

Modelplane's part: every field of its XRD. Read: `metadata.labels`, `spec.taints`, `spec.nodePools[]` (`name`,
`className`, `nodeCount` (default 1), `maxNodeCount`) and the observed `status` (conditions, gateway address,
`gpuPools[]` with `nodes` and `devices`) its fleet scheduler reads. Carried: `spec.cluster`, `spec.crossplane`, a
pool's `minNodeCount`, `zones`, `capacityBlock`, `fabric`, and the rest of `status`. Berth's part: the cluster's
`region`, each pool's capacity `shape` and GPU product, and for slice and bare-metal pools the hosts themselves.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.manifest import Spec, TaintEffect
from contracts.vocabulary import PoolShape
from fleet.deadlines import Duration, PoolDeadlines
from fleet.inference_class import Device
from fleet.meta import Carried, Name, ObjectMeta, PoolName
from fleet.node import Node, NodeTemplate
from fleet.openapi import check_block


class GpuFailurePolicy(StrEnum):
    """What Berth does with an active allocation whose GPU its agent judged failed."""

    TELL = "Tell"  # the allocation goes `degraded` and keeps running: its owner decides
    REPLACE = "Replace"  # the same, then it moves to a healthy node (the old one's VM destroyed, its NVMe wiped)


class Taint(Spec):
    key: str
    value: str | None = None
    effect: TaintEffect

    @classmethod
    def from_api(cls, taint: dict[str, Any]) -> Taint:
        """A node's taint as the API server returns it (its `timeAdded` is not needed to match it)."""
        return cls(key=taint.get("key") or "", value=taint.get("value"), effect=taint["effect"])


class NodePool(Spec):
    name: PoolName
    class_name: Name
    node_count: int | None = Field(
        default=None,
        description="Nodes in the pool: 1 when omitted (the XRD's default) for kubernetes pools; derived from the "
        "hosts for slice and bare-metal pools.",
    )
    min_node_count: int | None = Field(default=None, ge=0, description="Autoscaling floor; carried.")
    max_node_count: int | None = Field(
        default=None, ge=1, description="Autoscaling ceiling: the node count Modelplane publishes when set."
    )
    zones: list[str] | None = Field(default=None, description="Zones the pool is restricted to; carried.")
    capacity_block: Carried | None = Field(default=None, description="EKS Capacity Block reservation; carried.")
    fabric: Carried | None = Field(default=None, description="Node-to-node fabric (None, EFA, InfiniBand); carried.")
    shape: PoolShape = PoolShape.KUBERNETES
    gpu_product: str | None = Field(default=None, description="Product name used for requests and prices, e.g. H200.")
    nodes: list[Node] = Field(default_factory=list)
    node_template: NodeTemplate | None = None
    deadlines: PoolDeadlines | None = Field(
        default=None, description="Berth: per-state deadlines of allocations on this pool (slice and bare metal)."
    )
    max_lease: Duration | None = Field(
        default=None,
        description="Berth: the longest lease an allocation on this pool may have (`168h`, `90m`, or seconds); a "
        "request asking for longer is not placed here, and an allocation with no end gets this one.",
    )
    on_gpu_failure: GpuFailurePolicy = Field(
        default=GpuFailurePolicy.TELL,
        description="Berth: when a GPU under an active allocation fails, `Tell` its owner (the allocation goes "
        "`degraded` and keeps running) or also `Replace` it on a healthy node (its VM destroyed and its NVMe wiped "
        "as on any release, then placed again keeping its end).",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_node_count(cls, data: object) -> object:
        """Modelplane's XRD defaults nodeCount to 1; slice and bare-metal pools count their hosts instead."""
        if isinstance(data, dict) and data.get("shape", PoolShape.KUBERNETES.value) == PoolShape.KUBERNETES.value:
            if data.get("nodeCount", data.get("node_count")) is None:
                return {**data, "nodeCount": 1}
        return data

    @field_validator("capacity_block")
    @classmethod
    def _capacity_block(cls, value: Carried | None) -> Carried | None:
        return None if value is None else check_block("InferenceCluster", "spec.nodePools[].capacityBlock", value)

    @field_validator("fabric")
    @classmethod
    def _fabric(cls, value: Carried | None) -> Carried | None:
        return None if value is None else check_block("InferenceCluster", "spec.nodePools[].fabric", value)

    @property
    def published_nodes(self) -> int:
        """The node count Modelplane publishes for the pool (status.gpuPools[].nodes): maxNodeCount when the pool
        autoscales, else nodeCount. Nodes past nodeCount may not exist yet (Modelplane #139)."""
        if self.max_node_count is not None:
            return self.max_node_count
        return max(self.node_count or 0, 0)

    @property
    def autoscaled_nodes(self) -> int:
        """How many of the published nodes the autoscaler has yet to create (0 for a fixed-size pool)."""
        return max(self.published_nodes - max(self.node_count or 0, 0), 0)

    @model_validator(mode="after")
    def _hosts_match_shape(self) -> NodePool:
        has_hosts = bool(self.nodes) or self.node_template is not None
        if self.shape is PoolShape.KUBERNETES and has_hosts:
            raise ValueError("a kubernetes pool lists no hosts: give nodeCount, or set shape to gpu_slice or baremetal")
        if self.shape is not PoolShape.KUBERNETES and not self.gpu_product:
            raise ValueError(f"a {self.shape.value} pool needs gpuProduct (for example H200)")
        if self.shape is PoolShape.KUBERNETES and self.deadlines is not None:
            raise ValueError("deadlines apply to allocations: only gpu_slice and baremetal pools take them")
        if self.shape is PoolShape.KUBERNETES and self.max_lease is not None:
            raise ValueError("maxLease applies to allocations: only gpu_slice and baremetal pools take it")
        if self.shape is PoolShape.KUBERNETES and self.on_gpu_failure is not GpuFailurePolicy.TELL:
            raise ValueError("onGpuFailure applies to allocations: only gpu_slice and baremetal pools take it")
        return self


class Condition(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: str
    status: str
    message: str | None = None  # why, as the controller (or Berth's cluster driver) observed it


class Gateway(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    address: str | None = None


class GpuPoolStatus(BaseModel):
    """A pool as Modelplane publishes it: its node count and the devices copied from its class. When `devices` is
    published, placement matches against it (Modelplane's scheduler reads nothing else)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    nodes: int | None = None
    devices: list[Device] | None = None
    # Berth: the pool's nodes left out of `nodes` (`<node>: <why>`: NotReady, cordoned, a problem condition, a
    # taint), as its cluster driver observed them; the deployment's status names them when the pool is short.
    excluded: list[str] | None = None


class ClusterStatus(BaseModel):
    """Observed state, as Modelplane's controllers write it. Optional: without it Berth derives readiness itself."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=None)

    conditions: list[Condition] = Field(default_factory=list)
    gateway: Gateway | None = None
    gpu_pools: list[GpuPoolStatus] = Field(default_factory=list, alias="gpuPools")
    provider_config_ref: dict[str, Any] | None = Field(default=None, alias="providerConfigRef")
    cache: dict[str, Any] | None = None
    namespace: str | None = None

    @property
    def ready(self) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in self.conditions)


class InferenceClusterSpec(Spec):
    cluster: Carried | None = Field(
        default=None, description="How Modelplane provisions or reaches the cluster (source GKE, EKS, ... Existing)."
    )
    crossplane: Carried | None = Field(default=None, description="What Crossplane adds to a live XR; carried.")
    region: Name | None = Field(default=None, description="Berth region; required for slice and bare-metal pools.")
    taints: list[Taint] = Field(default_factory=list)
    node_pools: list[NodePool] = Field(default_factory=list)

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: Carried | None) -> Carried | None:
        return None if value is None else check_block("InferenceCluster", "spec.cluster", value)

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
