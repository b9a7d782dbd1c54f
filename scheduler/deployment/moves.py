"""Replicas moving off draining clusters and pools (`draining.py`), one at a time, never below what was serving.

Of the deployment's `replicas`, the ready replicas elsewhere cover some; the moving replicas cover the rest for as
long as they are needed, the ready ones kept first. One replacement is placed elsewhere at a time, and only while no
replica elsewhere is still starting; once it is ready, the next plan removes one moving replica (`Drained`) and
places the next replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.fleet_plan import DeploymentStatus, DroppedReplica, DropReason
from fleet.deployment import ScaleDownOrder
from fleet.replica import ModelReplica, ReplicaHealth
from scheduler.deployment.demand import Demand
from scheduler.deployment.scale_down import scale_down


@dataclass(frozen=True)
class Moves:
    kept: list[ModelReplica]  # moving replicas still needed: kept where they are for now
    dropped: list[DroppedReplica]  # moving replicas a ready replica elsewhere has replaced
    replacements: int  # replicas to place elsewhere now, beyond the shortfall (0 or 1)
    why: dict[str, str]  # moving replica -> why it moves


def plan_moves(demand: Demand, staying: Sequence[ModelReplica], moving: Sequence[tuple[ModelReplica, str]]) -> Moves:
    if not moving:
        return Moves(kept=[], dropped=[], replacements=0, why={})
    why = {replica.metadata.name: reason for replica, reason in moving}
    ready_elsewhere = sum(1 for r in staying if r.health is ReplicaHealth.READY)
    needed = max(0, min(len(moving), demand.replicas - ready_elsewhere))
    # Keep the ready ones first (they serve), then Modelplane's order among equals.
    chosen = scale_down([r for r, _ in moving], needed, ScaleDownOrder.HEALTH)
    dropped = [
        DroppedReplica(
            name=d.name,
            cluster=d.cluster,
            index=d.index,
            reason=DropReason.DRAINED,
            message=f"{why[d.name]}: ready replicas elsewhere took its place",
        )
        for d in chosen.dropped
    ]
    starting_elsewhere = any(r.health is not ReplicaHealth.READY for r in staying)
    replacements = 1 if chosen.kept and not starting_elsewhere else 0
    return Moves(kept=chosen.kept, dropped=dropped, replacements=replacements, why=why)


def with_moves(status: DeploymentStatus, moves: Moves) -> DeploymentStatus:
    """The status saying which replicas are moving, and why."""
    if not moves.kept and not moves.dropped:
        return status
    parts = [f"{name} ({moves.why[name]})" for name in sorted(r.metadata.name for r in moves.kept)]
    note = f"moving {len(moves.kept)} replica{'s' if len(moves.kept) != 1 else ''} one at a time: " + "; ".join(parts)
    if not moves.kept:
        note = "moved every replica off draining capacity"
    moving = sorted(r.metadata.name for r in moves.kept)
    return status.model_copy(update={"message": f"{status.message}; {note}", "moving": moving})
