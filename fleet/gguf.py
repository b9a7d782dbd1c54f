"""Seed 001: a model's GPU memory need estimated from its GGUF file, as GPUStack estimates GGUF models.

The file's metadata and tensor table are read with the `gguf` package (llama.cpp's own reader; no weight is
loaded: the reader maps the file and reads only the headers), and the need is the sum of three parts:

    weights      the bytes of every tensor, as stored (quantised types included): what is loaded onto the GPUs
    KV cache     layers x context tokens x KV heads x (key length + value length) x the cache type's bytes per
                 element; key and value lengths default to embedding_length / head_count, KV heads to head_count
                 (llama.cpp's llama_kv_cache; GGUF keys `<arch>.block_count`, `<arch>.attention.head_count[_kv]`,
                 `<arch>.attention.key_length`, `.value_length`, `<arch>.embedding_length`, `<arch>.context_length`)
    compute      a stated allowance for compute buffers and the runtime (`computeBuffer`, 1Gi unless given):
                 llama.cpp sizes its buffers per graph, which no file states

Cache types' bytes per element are ggml's: f32 4, f16 and bf16 2, q8_0 34/32 (32 values in 34 bytes), q4_0 18/32.
The estimate is the member's `gpuMemory`; the resource fit then splits it over GPUs and nodes as the candidate
order requires (`scheduler/fleet/resource_fit.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.deployment import GgufModel, ModelDeployment

CACHE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
MIB = 1024 * 1024
GIB = 1024 * MIB
_SUFFIXES = {"Ki": 1024, "Mi": MIB, "Gi": GIB, "Ti": 1024 * GIB, "k": 1000, "M": 10**6, "G": 10**9, "T": 10**12}


class GgufError(Exception):
    """The file cannot be read as a GGUF model, or lacks what the estimate needs; the message says which."""


@dataclass(frozen=True)
class GgufFacts:
    architecture: str
    layers: int
    context_length: int
    kv_heads: int
    key_length: int
    value_length: int
    weight_bytes: int
    tensors: int


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


def read_facts(path: Path) -> GgufFacts:
    """What the estimate needs from the file's header: raises GgufError naming what is missing or wrong."""
    from gguf import GGUFReader  # imported here: only `berth plan` with a GGUF member needs it (and numpy)

    try:
        reader = GGUFReader(path)
    except FileNotFoundError:
        raise GgufError(f"{path}: no such file") from None
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise GgufError(f"{path}: not a readable GGUF file ({error})") from None
    fields: dict[str, Any] = {name: field.contents() for name, field in reader.fields.items()}
    architecture = fields.get("general.architecture")
    if not isinstance(architecture, str):
        raise GgufError(f"{path}: no general.architecture in its metadata")

    def number(key: str, default: int | None = None) -> int:
        value = fields.get(f"{architecture}.{key}", default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise GgufError(f"{path}: {architecture}.{key} is missing or not a positive whole number")
        return value

    heads = number("attention.head_count")
    embedding = number("embedding_length")
    return GgufFacts(
        architecture=architecture,
        layers=number("block_count"),
        context_length=number("context_length"),
        kv_heads=number("attention.head_count_kv", heads),
        key_length=number("attention.key_length", embedding // heads or 1),
        value_length=number("attention.value_length", embedding // heads or 1),
        weight_bytes=sum(int(tensor.n_bytes) for tensor in reader.tensors),
        tensors=len(reader.tensors),
    )


def estimate(facts: GgufFacts, model: GgufModel, file: str) -> MemoryEstimate:
    """The three parts for the member's settings (a pure function of the facts)."""
    context = model.context_length or facts.context_length
    per_token = facts.layers * facts.kv_heads * (facts.key_length + facts.value_length)
    kv_cache = int(per_token * context * CACHE_BYTES[model.cache_type])
    return MemoryEstimate(
        file=file,
        context_length=context,
        cache_type=model.cache_type,
        weights=facts.weight_bytes,
        kv_cache=kv_cache,
        compute=_bytes(model.compute_buffer),
    )


def _bytes(quantity: str) -> int:
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * _SUFFIXES[suffix])
    return int(float(quantity))


def with_estimates(deployment: ModelDeployment) -> tuple[ModelDeployment, dict[str, MemoryEstimate]]:
    """The deployment with each GGUF member's `gpuMemory` set to its estimate, and the estimates by member
    (`<engine>/<member index>`). Raises GgufError for a file that cannot be estimated."""
    estimates: dict[str, MemoryEstimate] = {}
    engines = []
    for engine in deployment.spec.template.spec.engines:
        members = []
        for index, member in enumerate(engine.members):
            model = member.resources.gguf if member.resources is not None else None
            if model is not None and member.resources is not None:
                found = estimate(read_facts(Path(model.file)), model, model.file)
                estimates[f"{engine.name}/{index}"] = found
                resources = member.resources.model_copy(update={"gpu_memory": found.quantity})
                member = member.model_copy(update={"resources": resources})
            members.append(member)
        engines.append(engine.model_copy(update={"members": members}))
    if not estimates:
        return deployment, {}
    template = deployment.spec.template
    spec = template.spec.model_copy(update={"engines": engines})
    updated = deployment.model_copy(
        update={"spec": deployment.spec.model_copy(update={"template": template.model_copy(update={"spec": spec})})}
    )
    return updated, estimates
