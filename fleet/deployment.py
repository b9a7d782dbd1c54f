"""ModelDeployment: a model served as N replicas across the fleet, in Modelplane's shape plus a few Berth fields.

Modelplane's part is every field of its XRD. Read by placement: `metadata.namespace` (default "default"),
`spec.replicas`, and under `spec.template.spec` the `clusterSelector`, `tolerations`, `modelCacheRef` (new replicas
only where the cache stages; see `fleet/cache.py`) and `engines` (each a Standalone member, or a Leader with Workers,
whose `nodeSelector.devices` are DRA device requests with CEL selectors). Carried into the replicas Berth emits:
members' pod `template`s (checked against the XRD), `serving`, an engine's `phase`, `template.metadata.labels`.
`spec.crossplane` and `status` are accepted and not read, so a manifest copied from a live control plane loads.

Berth's additions, each from a seed, by its heading in docs/seeds.md: `spec.minReplicas` ("Partial scheduling above
minReplicas"), `requirements` ("Capabilities a pool must offer"), a member's `resources.gpuMemory` with an
optional `backend` instead of device requests ("Resource fit from a memory need"), and `placementStrategy`
("Binpack and spread", among fitting pools).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from contracts.manifest import Role, Spec, Toleration, rule_broken
from fleet.inference_class import QUANTITY_PATTERN
from fleet.meta import Carried, Name, ObjectMeta
from fleet.openapi import check_block, published_schema

POD_TEMPLATE = "spec.template.spec.engines[].members[].template"  # a member's pod template, in the XRD


class PlacementStrategy(StrEnum):
    BINPACK = "binpack"  # the fitting pool left with the fewest free nodes
    SPREAD = "spread"  # the fitting pool left with the most free nodes


class ScaleDownOrder(StrEnum):
    """Which replicas a scale-down removes first."""

    MODELPLANE = "Modelplane"  # the most loaded cluster, then the later cluster name, then the highest index
    HEALTH = "Health"  # in error, then starting, then ready; each by Modelplane's order (GPUStack's)


class FitGranularity(StrEnum):
    """What the fleet ledger charges a member sized by model memory (`resources`) for."""

    NODE = "Node"  # a whole node per pod, as Modelplane charges every member (the default)
    GPU = "Gpu"  # only the GPUs each pod claims: instances share a node's GPUs (docs/seeds.md, "GPU-level fit")


class CelSelector(Spec):
    cel: str = Field(min_length=1, description="A DRA CEL expression evaluated against one device.")


class DeviceRequest(Spec):
    """What one pod of the member needs from its node: `count` devices each satisfying every selector."""

    name: str = Field(min_length=1)
    count: PositiveInt = 1
    selectors: list[CelSelector] = Field(min_length=1)


def _require_unique(what: str, names: list[str]) -> None:
    """Refuse a list whose `what` repeat a name, naming every name repeated."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise rule_broken(f"{what} must be unique (repeated: {', '.join(duplicates)})")


class NodeSelector(Spec):
    devices: list[DeviceRequest] = Field(min_length=1)

    @field_validator("devices")
    @classmethod
    def _unique_request_names(cls, devices: list[DeviceRequest]) -> list[DeviceRequest]:
        _require_unique("device request names", [d.name for d in devices])
        return devices


class WorkerSpec(Spec):
    nodes: PositiveInt = Field(default=1, description="Nodes a Worker member spans, one worker pod per node.")


def quantity_text(value: object, example: str) -> object:
    """A field validator's body: a string that is not a Kubernetes quantity is refused with an example."""
    if isinstance(value, str) and not QUANTITY_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (for example {example})")
    return value


class GgufModel(Spec):
    """The memory need read from a GGUF file's metadata and tensor table by `berth plan` (fleet/gguf.py), instead of
    a figure (docs/seeds.md, "Estimating a GGUF model's memory")."""

    file: str = Field(min_length=1, description="Path of the .gguf file (relative: to the current directory).")
    context_length: PositiveInt | None = Field(
        default=None, le=10_000_000, description="Tokens of context to hold; unset: the model's own context_length."
    )
    cache_type: Literal["f32", "f16", "bf16", "q8_0", "q4_0"] = Field(
        default="f16", description="The KV cache's element type (llama.cpp's --cache-type-k/-v)."
    )
    compute_buffer: str = Field(
        default="1Gi",
        description="Allowance for the compute buffers and runtime beside weights and KV cache, as a quantity.",
        json_schema_extra={"pattern": QUANTITY_PATTERN.pattern},
    )

    @field_validator("compute_buffer", mode="before")
    @classmethod
    def _quantity(cls, value: object) -> object:
        if isinstance(value, str) and value.startswith("-"):
            raise ValueError(f"{value!r} is negative: an allowance is 0 or more")
        return quantity_text(value, "1Gi")


def _gpu_memory_published_as_required(schema: dict[str, Any]) -> None:
    schema["required"] = [*schema.get("required", []), "gpuMemory"]


class ModelResources(Spec):
    """The model's GPU memory need, given (`gpuMemory`) or estimated from a GGUF file (`gguf`); the scheduler
    derives the device request per pool (docs/seeds.md, "Resource fit from a memory need")."""

    model_config = ConfigDict(json_schema_extra=_gpu_memory_published_as_required)

    gpu_memory: str | SkipJsonSchema[None] = Field(
        default=None,
        description="GPU memory one copy of the model needs, as a quantity (e.g. 60Gi).",
        json_schema_extra={"pattern": QUANTITY_PATTERN.pattern},
    )
    # `berth plan` only (the control plane reads no file a manifest names): left out of the published schema, which
    # therefore requires gpuMemory, as the API does.
    gguf: SkipJsonSchema[GgufModel | None] = Field(
        default=None, description="Estimate gpuMemory from a GGUF file instead (`berth plan` only)."
    )
    backend: str | None = Field(
        default=None, description="Serving backend (vllm, sglang, mindie, voxbox, custom): decides the fallbacks."
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The share of each GPU's memory the instance may use (vLLM's --gpu-memory-utilization); "
        "unset: 0.9 for vllm and sglang under fitGranularity Gpu (GPUStack's default), else 1.",
    )

    _quantity = field_validator("gpu_memory", mode="before")(lambda value: quantity_text(value, "60Gi"))

    @model_validator(mode="after")
    def _one_source(self) -> ModelResources:
        if (self.gpu_memory is None) == (self.gguf is None):
            raise ValueError("give exactly one of gpuMemory and gguf")
        return self

    @field_validator("backend")
    @classmethod
    def _lowercase(cls, value: str | None) -> str | None:
        return value.lower() if value is not None else None


def _publish_pod_template(schema: dict[str, Any]) -> None:
    """The JSON schema of `template` is the XRD's, as `check_block` applies it (an unknown field in it is refused,
    so the API's schema says so; schemathesis found templates the published `object` allowed refused)."""
    schema["anyOf"] = [published_schema("ModelDeployment", POD_TEMPLATE), {"type": "null"}]


class Member(Spec):
    role: Role = Role.STANDALONE
    worker: WorkerSpec | None = None
    node_selector: NodeSelector | None = None
    resources: ModelResources | None = None
    template: Carried | None = Field(
        default=None,
        description="Pod template; carried into the replica, not read.",
        json_schema_extra=_publish_pod_template,
    )

    @field_validator("template")
    @classmethod
    def _pod_template(cls, value: Carried | None) -> Carried | None:
        if value is None:
            return None
        return check_block("ModelDeployment", POD_TEMPLATE, value)

    @model_validator(mode="after")
    def _consistent(self) -> Member:
        if self.worker is not None and self.role is not Role.WORKER:
            raise rule_broken("worker may only be set on a Worker member")
        if self.node_selector is not None and self.resources is not None:
            raise rule_broken("give either nodeSelector (device requests) or resources (a memory need), not both")
        if self.resources is not None and self.role is not Role.STANDALONE:
            raise rule_broken("resources (a memory need) is for Standalone members; a gang states device requests")
        return self

    @property
    def pods(self) -> int:
        """Pods of one copy: a Standalone or a Leader is one pod, a Worker one pod per node it spans."""
        return member_pods(self.role, self.worker.nodes if self.worker else None)

    @property
    def places_itself(self) -> bool:
        """Whether the member says what it needs; one that does not rides along on its engine's pool."""
        return self.node_selector is not None or self.resources is not None


def member_pods(role: Role, worker_nodes: int | None) -> int:
    """The pod count the node-cost rule (nodes = pods x copies) reads, for deployment and replica members alike."""
    if role is Role.WORKER:
        return worker_nodes if worker_nodes is not None else 1
    return 1


class Engine(Spec):
    name: Name
    copies: PositiveInt = 1
    phase: Literal["Prefill", "Decode"] | None = Field(
        default=None, description="Prefill or Decode under PrefillDecode serving; carried."
    )
    members: list[Member] = Field(min_length=1)

    @model_validator(mode="after")
    def _serving_unit(self) -> Engine:
        roles = [m.role for m in self.members]
        standalone = roles == [Role.STANDALONE]
        gang = roles.count(Role.LEADER) == 1 and Role.WORKER in roles and Role.STANDALONE not in roles
        if not (standalone or gang):
            raise rule_broken("an engine is either a single Standalone member or one Leader and one or more Workers")
        if not any(m.places_itself for m in self.members):
            raise rule_broken("at least one member of an engine must carry a nodeSelector (or resources)")
        return self


class ClusterSelector(Spec):
    match_labels: dict[str, str] = Field(default_factory=dict)


class ModelCacheRef(Spec):
    """A ModelCache in the deployment's own namespace."""

    name: str = Field(min_length=1)


class Serving(Spec):
    mode: Literal["Unified", "PrefillDecode"] = "Unified"


class TemplateMetadata(BaseModel):
    """Labels and annotations copied onto the replicas; other metadata is ignored as Kubernetes would."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class TemplateSpec(Spec):
    cluster_selector: ClusterSelector | None = None
    tolerations: list[Toleration] = Field(default_factory=list)
    engines: list[Engine] = Field(min_length=1)
    requirements: list[str] = Field(
        default_factory=list,
        description="Capabilities every pool used must offer (its class's `capabilities`), e.g. vllm.",
    )
    placement_strategy: PlacementStrategy | None = Field(
        default=None, description="Among fitting pools of a cluster: binpack or spread; unset takes the first."
    )
    single_cluster: bool = Field(
        default=False,
        description="Berth addition (as Seldon Core 2 puts a model on at most one server): every replica on one "
        "cluster, the one already hosting it preferred; refused when no cluster holds all replicas (or minReplicas "
        "of them).",
    )
    homogeneous: bool = Field(
        default=False,
        description="Berth addition (after KAITO's NodeGroupSizeFilter): every replica's engine on one node group "
        "(pool) of one cluster with enough free nodes for all replicas (or minReplicas of them).",
    )
    scale_down_order: ScaleDownOrder = Field(
        default=ScaleDownOrder.MODELPLANE,
        description="Berth addition (GPUStack's order): `Health` removes replicas in error first, then those still "
        "starting, then ready ones, each by Modelplane's order; `Modelplane` (the default) by its order alone.",
    )
    fit_granularity: FitGranularity = Field(
        default=FitGranularity.NODE,
        description="Berth addition (GPUStack's GPU-level fit): `Gpu` charges a member sized by `resources` only the "
        "GPUs its pods claim, so instances share a node's GPUs; `Node` (the default, Modelplane's ledger) charges a "
        "whole node per pod.",
    )
    model_cache_ref: ModelCacheRef | None = None
    serving: Serving | None = None

    @field_validator("engines")
    @classmethod
    def _unique_engine_names(cls, engines: list[Engine]) -> list[Engine]:
        _require_unique("engine names", [e.name for e in engines])
        return engines


class Template(Spec):
    metadata: TemplateMetadata | None = None
    spec: TemplateSpec


class ModelDeploymentSpec(Spec):
    crossplane: Carried | None = Field(default=None, description="What Crossplane adds to a live XR; carried.")
    replicas: NonNegativeInt
    min_replicas: NonNegativeInt | None = Field(
        default=None,
        description="Fewest replicas that still count as scheduled: with at least this many but fewer than asked the "
        "status is PartiallyScheduled; below it nothing new is placed and the status is ScheduleFailed.",
    )
    template: Template

    @model_validator(mode="after")
    def _min_not_above_replicas(self) -> ModelDeploymentSpec:
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            raise rule_broken(f"minReplicas ({self.min_replicas}) cannot exceed replicas ({self.replicas})")
        return self


class ModelDeployment(Spec):
    api_version: str
    kind: Literal["ModelDeployment"]
    metadata: ObjectMeta
    spec: ModelDeploymentSpec
    status: dict[str, Any] | None = Field(default=None, description="Observed status; ignored on input.")

    @property
    def namespace(self) -> str:
        return self.metadata.namespace_or_default
