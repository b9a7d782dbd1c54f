"""A GGUF member's memory need (docs/seeds.md, "Estimating a GGUF model's memory") from the facts its file states
(read by `fleet.gguf.read_facts`, in the caller): weights + KV cache for the context + the stated compute
allowance. The formula and its sources are in fleet/gguf.py; this is the arithmetic, and the deployment rewritten
with each estimate as the member's `gpuMemory`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from fleet.deployment import GgufModel, ModelDeployment
from fleet.gguf import GgufFacts
from scheduler.cel.quantity import parse_quantity

CACHE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}  # ggml's bytes per element
MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class MemoryEstimate:
    file: str
    context_length: int
    cache_type: str
    weights: int  # bytes
    kv_cache: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute

    @property
    def quantity(self) -> str:
        """The total as a quantity, rounded up to whole MiB."""
        return f"{-(-self.total // MIB)}Mi"

    def describe(self) -> str:
        return (
            f"{_gib(self.total)} = weights {_gib(self.weights)} + KV cache {_gib(self.kv_cache)} "
            f"({self.context_length} tokens, {self.cache_type}) + compute {_gib(self.compute)} (from {self.file})"
        )


def _gib(value: int) -> str:
    return f"{value / GIB:.2f}Gi"


def gguf_members(deployment: ModelDeployment) -> Iterator[tuple[str, GgufModel]]:
    """(`<engine>/<member index>`, its GGUF source) of every member sized by a GGUF file."""
    for engine in deployment.spec.template.spec.engines:
        for index, member in enumerate(engine.members):
            if member.resources is not None and member.resources.gguf is not None:
                yield f"{engine.name}/{index}", member.resources.gguf


def estimate(facts: GgufFacts, model: GgufModel) -> MemoryEstimate:
    context = model.context_length or facts.context_length
    per_token = facts.layers * facts.kv_heads * (facts.key_length + facts.value_length)
    return MemoryEstimate(
        file=model.file,
        context_length=context,
        cache_type=model.cache_type,
        weights=facts.weight_bytes,
        kv_cache=int(per_token * context * CACHE_BYTES[model.cache_type]),
        compute=math.ceil(parse_quantity(model.compute_buffer).as_approximate_float()),
    )


def with_estimates(deployment: ModelDeployment, estimates: Mapping[str, MemoryEstimate]) -> ModelDeployment:
    """The deployment with each estimated member's `gpuMemory` set to its estimate."""
    if not estimates:
        return deployment
    engines = []
    for engine in deployment.spec.template.spec.engines:
        members = []
        for index, member in enumerate(engine.members):
            found = estimates.get(f"{engine.name}/{index}")
            if found is not None and member.resources is not None:
                resources = member.resources.model_copy(update={"gpu_memory": found.quantity})
                member = member.model_copy(update={"resources": resources})
            members.append(member)
        engines.append(engine.model_copy(update={"members": members}))
    template = deployment.spec.template
    spec = template.spec.model_copy(update={"engines": engines})
    return deployment.model_copy(
        update={"spec": deployment.spec.model_copy(update={"template": template.model_copy(update={"spec": spec})})}
    )
