"""Seed 001's resource fit: derive a member's device request from the GPU memory its model needs.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from fleet.inference_class import ClaimKind, Device, InferenceClass
from scheduler.cel.quantity import Quantity, parse_quantity
from scheduler.fleet.demand import MemoryNeed

DISTRIBUTED_BACKENDS = frozenset({"vllm", "sglang", "mindie"})
CPU_BACKENDS = frozenset({"voxbox", "custom"})


class FitStep(StrEnum):
    ONE_GPU = "OneGpu"
    GPUS_OF_ONE_NODE = "GpusOfOneNode"
    SEVERAL_NODES = "SeveralNodes"
    CPU = "Cpu"

    @property
    def rank(self) -> int:
        """1 for the most preferred step; engines without a memory need rank 0."""
        return list(FitStep).index(self) + 1


@dataclass(frozen=True)
class MemoryFit:
    step: FitStep
    device: str
    count: int  # devices each pod claims on its node
    nodes: int  # nodes one copy spans (one pod per node)


def fit_memory(need: MemoryNeed, inference_class: InferenceClass) -> MemoryFit | str:
    devices = inference_class.spec.devices
    gpus = [(d, m) for d in devices if d.claim is ClaimKind.DRA and d.count > 0 and (m := _memory(d)) is not None]
    for device, memory in gpus:
        if memory.compare(need.amount) >= 0:
            return MemoryFit(FitStep.ONE_GPU, device.name, count=1, nodes=1)
    for device, memory in gpus:
        count = _multiples(need.amount, memory)
        if count <= device.count:
            return MemoryFit(FitStep.GPUS_OF_ONE_NODE, device.name, count=count, nodes=1)
    if gpus and need.backend in DISTRIBUTED_BACKENDS:
        device, memory = gpus[0]
        nodes = _multiples(need.amount, memory, per_node=device.count)
        return MemoryFit(FitStep.SEVERAL_NODES, device.name, count=device.count, nodes=nodes)
    if need.backend in CPU_BACKENDS:
        for device in devices:
            memory = _memory(device)
            if device.claim is ClaimKind.SYNTHETIC and memory is not None and memory.compare(need.amount) >= 0:
                return MemoryFit(FitStep.CPU, device.name, count=1, nodes=1)
    return _refusal(need, inference_class, gpus)


def _refusal(need: MemoryNeed, inference_class: InferenceClass, gpus: list[tuple[Device, Quantity]]) -> str:
    """Only reached when steps 1 and 2 failed and step 3 did not apply, so each clause says why."""
    backend = repr(need.backend) if need.backend else "not given"
    if gpus:
        largest = max(gpus, key=lambda gpu: gpu[1].as_approximate_float())[0]
        steps = [
            f"one GPU: the largest holds {_memory_text(largest)}",
            "GPUs of one node: " + ", ".join(f"{d.count} x {_memory_text(d)}" for d, _ in gpus),
            f"several nodes: backend {backend} does not serve across nodes ({_names(DISTRIBUTED_BACKENDS)} do)",
        ]
    else:
        steps = [f"GPUs: class {inference_class.metadata.name} publishes no DRA device with a memory capacity"]
    if need.backend in CPU_BACKENDS:
        hosts = [_memory_text(d) for d in inference_class.spec.devices if d.claim is ClaimKind.SYNTHETIC and _memory(d)]
        steps.append(f"CPU: host memory {', '.join(hosts)} is too small" if hosts else "CPU: no host memory published")
    else:
        steps.append(f"CPU: backend {backend} does not run on CPU ({_names(CPU_BACKENDS)} do)")
    return f"needs {need.text} of GPU memory: " + "; ".join(steps)


def _memory_text(device: Device) -> str | None:
    """The device's `memory` capacity, named plainly or qualified by a domain (gpu.nvidia.com/memory)."""
    for name, capacity in device.capacity.items():
        if name == "memory" or name.endswith("/memory"):
            return capacity.value
    return None


def _memory(device: Device) -> Quantity | None:
    text = _memory_text(device)
    return parse_quantity(text) if text is not None else None


def _multiples(need: Quantity, unit: Quantity, per_node: int = 1) -> int:
    """How many units (or nodes of `per_node` units) hold `need`: exact, since byte counts are whole floats."""
    return max(1, math.ceil(Fraction(need.as_approximate_float()) / (Fraction(unit.as_approximate_float()) * per_node)))


def _names(backends: frozenset[str]) -> str:
    return ", ".join(sorted(backends))
