"""What a GGUF model file says about its memory need (docs/seeds.md, "Estimating a GGUF model's memory"), read with
the `gguf` package (llama.cpp's own reader; no weight is loaded: the reader maps the file and reads only the
headers). The estimate made from it is a pure function of these facts (`scheduler/deployment/estimate.py`), the sum of
three parts:

    weights      the bytes of every tensor, as stored (quantised types included): what is loaded onto the GPUs
    KV cache     layers x context tokens x KV heads x (key length + value length) x the cache type's bytes per
                 element; key and value lengths default to embedding_length / head_count, KV heads to head_count
                 (llama.cpp's llama_kv_cache; GGUF keys `<arch>.block_count`, `<arch>.attention.head_count[_kv]`,
                 `<arch>.attention.key_length`, `.value_length`, `<arch>.embedding_length`, `<arch>.context_length`)
    compute      a stated allowance for compute buffers and the runtime (`computeBuffer`, 1Gi unless given):
                 llama.cpp sizes its buffers per graph, which no file states

Cache types' bytes per element are ggml's: f32 4, f16 and bf16 2, q8_0 34/32 (32 values in 34 bytes), q4_0 18/32.
The estimate is the member's `gpuMemory`; the resource fit then splits it over GPUs and nodes as the candidate
order requires (`scheduler/deployment/resource_fit.py`). Only `berth plan` reads files: the control plane refuses a
member that names one (`workflows/deployment/spec.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
