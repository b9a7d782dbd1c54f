"""Turn scheduling decisions, and replicas already running, into the plan's ReplicaPlacement records.

Records are immutable, and a large deployment repeats a few engine shapes many times (every replica of a shape
that landed on a pool of the same class looks alike), so each distinct engine placement is built once per pass
and shared.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from contracts.fleet_plan import (
    EnginePlacement,
    FitStep,
    GpuPlacement,
    MemberPlacement,
    ReplicaPlacement,
    RequestPlacement,
)
from fleet.replica import ModelReplica, ReplicaEngine, ReplicaMember, stamped_member_cost
from scheduler.deployment.engines import EngineChoice
from scheduler.deployment.fill import NewReplica

Source = TypeVar("Source")


def replica_name(deployment: str, cluster: str, index: int) -> str:
    return f"{deployment}-{cluster}-{index}"


class PlacementRecords:
    def __init__(self, deployment: str) -> None:
        self._deployment = deployment
        self._engines: dict[Hashable, EnginePlacement] = {}

    def new(self, replica: NewReplica, gateway: str | None) -> ReplicaPlacement:
        return ReplicaPlacement(
            name=replica_name(self._deployment, replica.cluster, replica.index),
            cluster=replica.cluster,
            index=replica.index,
            origin="new",
            gateway_address=gateway,
            engines=[
                self._shared((c.engine.position, c.pool.name, c.fit, c.charge.gpus), self._chosen, c)
                for c in replica.engines
            ],
        )

    def retained(self, replica: ModelReplica, gateway: str | None) -> ReplicaPlacement:
        """A kept replica as it runs: its pins and the cost it was stamped with, whatever the spec now says."""
        return ReplicaPlacement(
            name=replica.metadata.name,
            cluster=replica.cluster or "",
            index=replica.index,
            origin="retained",
            gateway_address=gateway,
            engines=[self._shared(_observed_key(e), self._observed, e) for e in replica.spec.engines],
        )

    def _shared(self, key: Hashable, build: Callable[[Source], EnginePlacement], source: Source) -> EnginePlacement:
        found = self._engines.get(key)
        if found is None:
            found = self._engines[key] = build(source)
        return found

    @staticmethod
    def _chosen(choice: EngineChoice) -> EnginePlacement:
        members = []
        gpus = {g.member: g for g in choice.charge.gpus}
        for member, fit in zip(choice.engine.members, choice.fit.members, strict=True):
            held = gpus.get(member.position)
            members.append(
                MemberPlacement(
                    role=member.role,
                    pool=choice.pool.name,
                    nodes=fit.pods * choice.engine.copies if fit.claims and held is None else 0,
                    device_requests=[
                        RequestPlacement(
                            name=c.name,
                            count=c.count,
                            device=c.device,
                            selectors=list(c.selectors),
                            device_class_name=c.device_class_name,
                        )
                        for c in fit.claims
                    ],
                    fit=fit.fit.step if fit.fit else None,
                    span=fit.fit.nodes if fit.fit and fit.fit.step is FitStep.SEVERAL_NODES else None,
                    gpus=GpuPlacement(device=held.device, per_pod=held.count, nodes=list(held.nodes)) if held else None,
                )
            )
        return EnginePlacement(name=choice.engine.name, pool=choice.pool.name, nodes=choice.fit.nodes, members=members)

    @staticmethod
    def _observed(engine: ReplicaEngine) -> EnginePlacement:
        members = [_observed_member(m, engine.copies) for m in engine.members]
        return EnginePlacement(
            name=engine.name,
            pool=next((m.pool for m in members if m.pool), None),
            nodes=sum(m.nodes for m in members),
            members=members,
        )


def _observed_key(engine: ReplicaEngine) -> Hashable:
    return (
        engine.name,
        engine.copies,
        tuple(
            (
                m.role,
                m.node_pool_name,
                m.pods,
                tuple((r.name, r.count, r.device, tuple(s.cel for s in r.selectors)) for r in m.device_requests),
                (m.gpus.device, tuple(m.gpus.nodes)) if m.gpus is not None else None,
            )
            for m in engine.members
        ),
    )


def _observed_member(member: ReplicaMember, copies: int) -> MemberPlacement:
    return MemberPlacement(
        role=member.role,
        pool=member.node_pool_name,
        nodes=stamped_member_cost(member, copies),
        device_requests=[
            RequestPlacement(
                name=r.name,
                count=r.count,
                device=r.device,
                selectors=[s.cel for s in r.selectors],
                device_class_name=r.device_class_name,
            )
            for r in member.device_requests
        ],
        span=member.nodes,
        gpus=GpuPlacement(
            device=member.gpus.device,
            per_pod=sum(r.count for r in member.device_requests),
            nodes=list(member.gpus.nodes),
        )
        if member.gpus is not None
        else None,
    )
