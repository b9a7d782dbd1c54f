"""The resource fit (docs/seeds.md, "Resource fit from a memory need"): derive a member's device request from the
GPU memory its model needs.

Per pool, the candidates are tried in GPUStack's order and the first that fits is taken:

1. one GPU that holds the model;
2. several GPUs of one node that hold it together;
3. several homogeneous nodes, every GPU of each, for backends that serve across nodes (vllm, sglang, mindie);
4. the node's CPUs and memory, for backends that run on CPU (voxbox, custom).

A pool is homogeneous by construction (one InferenceClass describes every node), so "several nodes" means N nodes
of the pool. A GPU is a DRA device with a `memory` capacity; a node's host memory is a Synthetic device with a
`memory` capacity, as classes publish a node's CPU description. The step reached is also the fit's rank across
pools: a pool where one GPU suffices beats one that needs a whole node, as GPUStack stops at the first step that
finds any candidate. A refusal names each step and why it failed, in the manner of KAITO's descriptive denial.

Degenerate capacities never crash a plan: a device whose memory is missing, unparsable, zero, negative or not finite
is left out of the sizing and named in the refusal; so is a need that is not a positive, finite quantity. A MIG
GPU instance (a device with a `migProfile` attribute) is a candidate for step 1 only: instances never combine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from contracts.fleet_plan import FitStep
from fleet.inference_class import ClaimKind, Device, InferenceClass
from scheduler.cel.quantity import Quantity, QuantityError, parse_quantity
from scheduler.deployment.demand import MemoryNeed

DISTRIBUTED_BACKENDS = frozenset({"vllm", "sglang", "mindie"})
MIG_ATTRIBUTE = "migProfile"  # a MIG GPU instance (`fleet/nodelist.py`): it may hold a model alone, never with others
CPU_BACKENDS = frozenset({"voxbox", "custom"})


@dataclass(frozen=True)
class MemoryFit:
    step: FitStep
    device: str
    count: int  # devices each pod claims on its node
    nodes: int  # nodes one copy spans (one pod per node)
    per_node: int = 1  # devices of this kind one node has (what a GPU-level ledger shares among instances)


def fit_memory(need: MemoryNeed, inference_class: InferenceClass) -> MemoryFit | str:
    """`need.utilization` below 1 (vLLM's headroom) makes each GPU hold that share of its memory for the model."""
    amount = _magnitude(need.amount) if need.amount is not None else None
    if amount is None:
        return f"gpuMemory {need.text!r} is not a positive, finite quantity, so no device can be sized for it"
    devices = inference_class.spec.devices
    gpus = [
        (d, m * need.utilization)
        for d in devices
        if d.claim is ClaimKind.DRA and d.count > 0 and (m := _usable(d)) is not None
    ]
    for device, usable in gpus:
        if usable >= amount:
            return MemoryFit(FitStep.ONE_GPU, device.name, count=1, nodes=1, per_node=device.count)
    whole = [(d, m) for d, m in gpus if MIG_ATTRIBUTE not in d.attributes]  # MIG instances do not combine
    for device, usable in whole:
        count = _multiples(amount, usable)
        if count <= device.count:
            return MemoryFit(FitStep.GPUS_OF_ONE_NODE, device.name, count=count, nodes=1, per_node=device.count)
    if whole and need.backend in DISTRIBUTED_BACKENDS:
        device, usable = whole[0]
        nodes = _multiples(amount, usable * device.count)
        return MemoryFit(FitStep.SEVERAL_NODES, device.name, count=device.count, nodes=nodes, per_node=device.count)
    if need.backend in CPU_BACKENDS:
        for device in devices:
            memory = _usable(device)
            if device.claim is ClaimKind.SYNTHETIC and memory is not None and memory >= amount:
                return MemoryFit(FitStep.CPU, device.name, count=1, nodes=1)
    return _refusal(need, inference_class, [d for d, _ in gpus])


def _refusal(need: MemoryNeed, inference_class: InferenceClass, gpus: list[Device]) -> str:
    """Only reached when steps 1 and 2 failed and step 3 did not apply, so each clause says why."""
    backend = repr(need.backend) if need.backend else "not given"
    if gpus:
        largest = max(gpus, key=lambda gpu: _usable(gpu) or 0)
        share = "" if need.utilization == 1 else f" ({_percent(need.utilization)} of it usable: gpuMemoryUtilization)"
        steps = [
            f"one GPU: the largest holds {_memory_text(largest)}{share}",
            "GPUs of one node: " + ", ".join(f"{d.count} x {_memory_text(d)}" for d in gpus),
            f"several nodes: backend {backend} does not serve across nodes ({_names(DISTRIBUTED_BACKENDS)} do)",
        ]
    else:
        steps = [f"GPUs: class {inference_class.metadata.name} publishes no DRA device with a usable memory capacity"]
    steps[:0] = [
        f"device {d.name}: memory {text!r} {problem}"
        for d in inference_class.spec.devices
        if (text := _memory_text(d)) is not None and (problem := _unusable(text)) is not None
    ]
    if need.backend in CPU_BACKENDS:
        hosts = [_memory_text(d) for d in inference_class.spec.devices if d.claim is ClaimKind.SYNTHETIC and _usable(d)]
        steps.append(f"CPU: host memory {', '.join(hosts)} is too small" if hosts else "CPU: no host memory published")
    else:
        steps.append(f"CPU: backend {backend} does not run on CPU ({_names(CPU_BACKENDS)} do)")
    return f"needs {need.text} of GPU memory: " + "; ".join(steps)


def _percent(share: Fraction) -> str:
    return f"{float(share) * 100:g}%"


def _memory_text(device: Device) -> str | None:
    """The device's `memory` capacity, named plainly or qualified by a domain (gpu.nvidia.com/memory)."""
    for name, capacity in device.capacity.items():
        if name == "memory" or name.endswith("/memory"):
            return capacity.value
    return None


def _usable(device: Device) -> Fraction | None:
    """The device's memory in bytes when it is usable for sizing; a missing, unparsable, zero, negative or infinite
    memory is None, so the device is never sized against (and the refusal names it) instead of dividing by it."""
    text = _memory_text(device)
    if text is None or _unusable(text) is not None:
        return None
    return _magnitude(parse_quantity(text))


def _unusable(text: str) -> str | None:
    """Why a published memory capacity cannot size anything, or None when it can."""
    try:
        quantity = parse_quantity(text)
    except QuantityError as exc:
        return f"is not a quantity ({exc})"
    if _magnitude(quantity) is None:
        return "is not a positive, finite amount"
    return None


def _magnitude(quantity: Quantity) -> Fraction | None:
    """The amount as an exact fraction when it is positive and finite, else None."""
    value = quantity.as_approximate_float()
    if quantity.sign() <= 0 or not math.isfinite(value) or value <= 0:
        return None
    return Fraction(value)


def _multiples(need: Fraction, unit: Fraction) -> int:
    """How many units hold `need`, exactly (byte counts are whole; a utilization share is a small fraction). Both
    were checked positive (`_usable`, `fit_memory`), so this never divides by zero."""
    return max(1, math.ceil(need / unit))


def _names(backends: frozenset[str]) -> str:
    return ", ".join(sorted(backends))
