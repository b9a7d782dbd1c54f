"""A ModelDeployment reduced to what placement reads: per engine, its copies and what each member needs.

Compiling once per scheduling pass keeps the per-cluster loop free of pydantic traversal and lets every cache in
the pass key on small integers (engine and member positions) instead of model objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from contracts.manifest import Role, Toleration
from fleet.deployment import (
    DeviceRequest,
    FitGranularity,
    ModelDeployment,
    ModelResources,
    PlacementStrategy,
    ScaleDownOrder,
)
from scheduler.cel.quantity import Quantity, QuantityError, parse_quantity


@dataclass(frozen=True)
class MemoryNeed:
    """GPU memory one copy of the model needs, and the backend that decides the fallbacks (docs/seeds.md, "Resource
    fit from a memory need")."""

    text: str
    amount: Quantity | None  # None: the text matches the quantity syntax but does not parse (e.g. 1e999)
    backend: str | None
    utilization: Fraction = Fraction(1)  # the share of each GPU's memory the instance may use
    per_gpu: bool = False  # fitGranularity Gpu: charged the GPUs its pods claim, not whole nodes


# GPUStack starts these with vLLM's --gpu-memory-utilization 0.9 (SGLang's --mem-fraction-static is alike), so an
# instance may count on 90% of each GPU it is given; the others may use all of it.
HEADROOM_BACKENDS = frozenset({"vllm", "sglang"})
DEFAULT_HEADROOM = Fraction(9, 10)


@dataclass(frozen=True)
class MemberDemand:
    position: int
    role: Role
    pods: int  # pods of one copy (nodes = pods x copies when the member claims devices)
    requests: tuple[DeviceRequest, ...]  # nodeSelector.devices; empty when the member states none
    memory: MemoryNeed | None
    capabilities: frozenset[str]  # what its pool's class must offer (deployment requirements, plus its backend)

    @property
    def label(self) -> str:
        return f"member {self.position} ({self.role})"


@dataclass(frozen=True)
class EngineDemand:
    position: int
    name: str
    copies: int
    members: tuple[MemberDemand, ...]


@dataclass(frozen=True)
class Demand:
    deployment: str
    api_version: str
    replicas: int
    min_replicas: int | None
    match_labels: dict[str, str]
    tolerations: tuple[Toleration, ...]
    strategy: PlacementStrategy | None
    engines: tuple[EngineDemand, ...]
    single_cluster: bool = False  # every replica on one cluster (docs/seeds.md, "A model on one cluster")
    # Each engine of every replica on one node group (pool) of one cluster (docs/seeds.md, "One node group for every
    # replica").
    homogeneous: bool = False
    scale_down_order: ScaleDownOrder = ScaleDownOrder.MODELPLANE  # which replicas a scale-down removes first

    @property
    def together(self) -> bool:
        """Whether the replicas must share a cluster (`together.py`) rather than spread across the fleet."""
        return self.single_cluster or self.homogeneous

    def selector_expressions(self) -> list[str]:
        """Every CEL expression, in the order a reader meets them in the manifest (so errors name the first)."""
        return [s.cel for e in self.engines for m in e.members for r in m.requests for s in r.selectors]


def compile_demand(deployment: ModelDeployment) -> Demand:
    template = deployment.spec.template.spec
    requirements = frozenset(template.requirements)
    engines = []
    for e, engine in enumerate(template.engines):
        members = []
        for m, member in enumerate(engine.members):
            memory = None
            capabilities = requirements
            if member.resources is not None:
                memory = _memory_need(member.resources, template.fit_granularity)
                if memory.backend is not None:
                    capabilities = requirements | {memory.backend}
            members.append(
                MemberDemand(
                    position=m,
                    role=member.role,
                    pods=member.pods,
                    requests=tuple(member.node_selector.devices) if member.node_selector else (),
                    memory=memory,
                    capabilities=capabilities,
                )
            )
        engines.append(EngineDemand(position=e, name=engine.name, copies=engine.copies, members=tuple(members)))
    selector = template.cluster_selector
    return Demand(
        deployment=deployment.metadata.name,
        api_version=deployment.api_version,
        replicas=deployment.spec.replicas,
        min_replicas=deployment.spec.min_replicas,
        match_labels=dict(selector.match_labels) if selector else {},
        tolerations=tuple(template.tolerations),
        strategy=template.placement_strategy,
        engines=tuple(engines),
        single_cluster=template.single_cluster,
        homogeneous=template.homogeneous,
        scale_down_order=template.scale_down_order,
    )


def _memory_need(resources: ModelResources, granularity: FitGranularity) -> MemoryNeed:
    # A GGUF member not estimated yet (only `berth plan` reads the file, fleet/gguf.py) fits no pool.
    text = resources.gpu_memory or "an unestimated GGUF model"
    per_gpu = granularity is FitGranularity.GPU
    if resources.gpu_memory_utilization is not None:
        utilization = Fraction(resources.gpu_memory_utilization).limit_denominator(1000)
    elif per_gpu and resources.backend in HEADROOM_BACKENDS:
        utilization = DEFAULT_HEADROOM
    else:
        utilization = Fraction(1)
    return MemoryNeed(
        text=text,
        amount=_quantity_or_none(text),
        backend=resources.backend,
        utilization=utilization,
        per_gpu=per_gpu,
    )


def _quantity_or_none(text: str) -> Quantity | None:
    """A need that cannot be parsed is refused per pool by the resource fit, never a crash of the whole pass."""
    try:
        return parse_quantity(text)
    except QuantityError:
        return None
