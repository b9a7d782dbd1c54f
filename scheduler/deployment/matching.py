"""Whether a pool can host a member, and an engine, ignoring capacity: the per-class half of rules 6 and 7.

Everything here depends on the pool's InferenceClass and never on the cluster, so each answer is computed once
per (engine or member, class) and shared by every pool of that class across the fleet. Capacity, the per-pool
half, is the caller's: see `engines.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contracts.fleet_plan import FitStep
from fleet.inference_class import InferenceClass
from scheduler.deployment.capabilities import missing_capabilities
from scheduler.deployment.demand import EngineDemand, MemberDemand
from scheduler.deployment.devices import Claim, match_requests
from scheduler.deployment.ledger import GpuPods
from scheduler.deployment.resource_fit import MemoryFit, fit_memory
from scheduler.deployment.selectors import DeviceSelectors


@dataclass(frozen=True)
class MemberFit:
    claims: tuple[Claim, ...]  # empty: the member claims nothing and rides on its gang's nodes at no cost
    pods: int  # pods of one copy
    # How the resource fit derived the claim, for members that gave memory (docs/seeds.md, "Resource fit from a
    # memory need").
    fit: MemoryFit | None = None
    per_gpu: bool = False  # fitGranularity Gpu, within one node: charged the GPUs it claims, not whole nodes


@dataclass(frozen=True)
class EngineFit:
    members: tuple[MemberFit, ...]
    nodes: int  # whole nodes on one pool: pods x copies of every member that claims devices, except GPU-level ones
    rank: int  # resource-fit step reached (0 when no member states a memory need); lower is preferred
    gpus: tuple[GpuPods, ...] = ()  # what the GPU-level members claim, pod by pod (`ledger.py` finds them a node)


class Matcher:
    def __init__(self, classes: Mapping[str, InferenceClass], selectors: DeviceSelectors) -> None:
        self._classes = classes
        self._selectors = selectors
        self._members: dict[tuple[int, int, str | None], MemberFit | str] = {}
        self._engines: dict[tuple[int, str | None], EngineFit | str] = {}

    def member(self, engine: EngineDemand, member: MemberDemand, class_name: str | None) -> MemberFit | str:
        """The member's fit on a pool of this class, or why it does not fit."""
        key = (engine.position, member.position, class_name)
        found = self._members.get(key)
        if found is None:
            found = self._members[key] = self._fit_member(member, class_name)
        return found

    def engine(self, engine: EngineDemand, class_name: str | None) -> EngineFit | str:
        """Every member's fit on one pool of this class, or why the engine cannot use such a pool."""
        key = (engine.position, class_name)
        found = self._engines.get(key)
        if found is None:
            found = self._engines[key] = self._fit_engine(engine, class_name)
        return found

    def _fit_member(self, member: MemberDemand, class_name: str | None) -> MemberFit | str:
        if class_name is None:
            return "the pool is not declared in spec.nodePools, so its InferenceClass is unknown"
        inference_class = self._classes.get(class_name)
        if inference_class is None:
            return f"InferenceClass {class_name} is not defined"
        lacking = missing_capabilities(member.capabilities, inference_class)
        if lacking is not None:
            return lacking
        if member.memory is not None:
            fit = fit_memory(member.memory, inference_class)
            if isinstance(fit, str):
                return fit
            name = "cpu" if fit.step is FitStep.CPU else "gpu"
            through = next((d.claimed_through for d in inference_class.spec.devices if d.name == fit.device), None)
            claim = Claim(name=name, count=fit.count, device=fit.device, device_class_name=through)
            per_gpu = member.memory.per_gpu and fit.step in (FitStep.ONE_GPU, FitStep.GPUS_OF_ONE_NODE)
            return MemberFit(claims=(claim,), pods=fit.nodes, fit=fit, per_gpu=per_gpu)
        claims = match_requests(member.requests, inference_class, self._selectors)
        if isinstance(claims, str):
            return claims
        return MemberFit(claims=claims, pods=member.pods)

    def _fit_engine(self, engine: EngineDemand, class_name: str | None) -> EngineFit | str:
        fits = []
        for member in engine.members:
            fit = self.member(engine, member, class_name)
            if isinstance(fit, str):
                return f"{member.label}: {fit}"
            fits.append(fit)
        if not any(fit.claims for fit in fits):
            return "no member claims a DRA device there (only Synthetic devices matched)"
        return EngineFit(
            members=tuple(fits),
            nodes=sum(fit.pods * engine.copies for fit in fits if fit.claims and not fit.per_gpu),
            rank=max((fit.fit.step.rank for fit in fits if fit.fit is not None), default=0),
            gpus=tuple(
                GpuPods(
                    member=m,
                    label=engine.members[m].label,
                    device=fit.fit.device,
                    count=fit.fit.count,
                    per_node=fit.fit.per_node,
                    pods=fit.pods * engine.copies,
                )
                for m, fit in enumerate(fits)
                if fit.per_gpu and fit.fit is not None
            ),
        )
