"""Turn scheduling decisions, and replicas already running, into the plan's ReplicaPlacement records."""

from __future__ import annotations

from fleet.replica import ModelReplica, ReplicaMember, stamped_member_cost
from scheduler.fleet.fill import NewReplica
from scheduler.fleet.resource_fit import FitStep
from scheduler.fleet.results import EnginePlacement, MemberPlacement, ReplicaPlacement, RequestPlacement


def replica_name(deployment: str, cluster: str, index: int) -> str:
    return f"{deployment}-{cluster}-{index}"


def new_placement(deployment: str, replica: NewReplica, gateway: str | None) -> ReplicaPlacement:
    engines = []
    for choice in replica.engines:
        members = []
        for member, fit in zip(choice.engine.members, choice.fit.members, strict=True):
            members.append(
                MemberPlacement(
                    role=member.role,
                    pool=choice.pool.name,
                    nodes=fit.pods * choice.engine.copies if fit.claims else 0,
                    device_requests=[
                        RequestPlacement(name=c.name, count=c.count, device=c.device, selectors=list(c.selectors))
                        for c in fit.claims
                    ],
                    fit=fit.fit.step if fit.fit else None,
                    span=fit.fit.nodes if fit.fit and fit.fit.step is FitStep.SEVERAL_NODES else None,
                )
            )
        engines.append(
            EnginePlacement(name=choice.engine.name, pool=choice.pool.name, nodes=choice.fit.nodes, members=members)
        )
    return ReplicaPlacement(
        name=replica_name(deployment, replica.cluster, replica.index),
        cluster=replica.cluster,
        index=replica.index,
        origin="new",
        gateway_address=gateway,
        engines=engines,
    )


def retained_placement(replica: ModelReplica, gateway: str | None) -> ReplicaPlacement:
    """A kept replica as it runs: its pins and the cost it was stamped with, whatever the spec now says."""
    engines = []
    for engine in replica.spec.engines:
        members = [_observed_member(m, engine.copies) for m in engine.members]
        engines.append(
            EnginePlacement(
                name=engine.name,
                pool=next((m.pool for m in members if m.pool), None),
                nodes=sum(m.nodes for m in members),
                members=members,
            )
        )
    return ReplicaPlacement(
        name=replica.metadata.name,
        cluster=replica.cluster or "",
        index=replica.index,
        origin="retained",
        gateway_address=gateway,
        engines=engines,
    )


def _observed_member(member: ReplicaMember, copies: int) -> MemberPlacement:
    return MemberPlacement(
        role=member.role,
        pool=member.node_pool_name,
        nodes=stamped_member_cost(member, copies),
        device_requests=[
            RequestPlacement(name=r.name, count=r.count, device=r.device, selectors=[s.cel for s in r.selectors])
            for r in member.device_requests
        ],
        span=member.nodes,
    )
