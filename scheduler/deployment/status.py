"""Rule 9: the deployment's status, in Modelplane's reasons and Seldon's phases (docs/seeds.md, "Partial scheduling
above minReplicas").

Desired vs available replicas; FullyScheduled when every replica has a place, PartiallyScheduled when at least
minReplicas do (at least one when minReplicas is unset: Modelplane treats a short fill as partial, not an error),
ScheduleFailed below that (and then no new replica is placed: scheduling is partial only above minReplicas; the
message says how many could have been). When the plan falls short, the reason says why:
NoClusters when no cluster matches clusterSelector, else InsufficientCapacity with Modelplane's "N of M replicas scheduled (checked K clusters)" and,
beyond Modelplane, why each selected cluster took no further replica.
"""

from __future__ import annotations

from collections.abc import Mapping

from contracts.fleet_plan import ClusterVerdict, DeploymentStatus, Phase, SelectorProblem, StatusReason
from scheduler.cel import SelectorCompileError
from scheduler.deployment.demand import Demand
from scheduler.deployment.engines import Refusal


def deployment_status(
    demand: Demand,
    retained: int,
    new: int,
    checked: int,
    refusals: Mapping[str, Refusal],
    held_back: int = 0,
    refused: tuple[StatusReason, str] | None = None,
) -> DeploymentStatus:
    """`held_back`: replicas the fill found room for but that were not placed, the total being below minReplicas.
    `refused`: the reason and message when singleCluster or homogeneous placement found no cluster or node group."""
    available = retained + new
    desired = demand.replicas
    scheduled = f"{available} of {desired} replicas scheduled"
    if available >= desired:
        phase, reason, message = Phase.FULLY_SCHEDULED, None, scheduled
    else:
        floor = max(demand.min_replicas or 0, 1)
        phase = Phase.PARTIALLY_SCHEDULED if available >= floor else Phase.SCHEDULE_FAILED
        if checked == 0:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(demand.match_labels.items()))
            reason, message = StatusReason.NO_CLUSTERS, f"no InferenceCluster matches clusterSelector {{{labels}}}"
        else:
            reason = StatusReason.INSUFFICIENT_CAPACITY
            message = f"{scheduled} (checked {checked} clusters)"  # Modelplane's wording, kept verbatim
            if demand.min_replicas and available < demand.min_replicas:
                message = (
                    f"{available + held_back} of {desired} replicas can be scheduled, fewer than minReplicas "
                    f"{demand.min_replicas}: no new replica placed (checked {checked} clusters)"
                )
    if refused is not None:  # the replicas kept are left as they were, but the deployment is not scheduled
        phase, (reason, message) = Phase.SCHEDULE_FAILED, refused
    return DeploymentStatus(
        desired=desired,
        min_replicas=demand.min_replicas,
        available=available,
        retained=retained,
        new=new,
        phase=phase,
        reason=reason,
        message=message,
        clusters_checked=checked,
        clusters=[
            ClusterVerdict(cluster=name, reason=refusal.reason, message=refusal.message)
            for name, refusal in sorted(refusals.items())
        ],
    )


def invalid_selector_status(demand: Demand, existing: int, error: SelectorCompileError) -> DeploymentStatus:
    """A selector that does not compile stops scheduling and changes nothing: existing replicas stay as they are."""
    return DeploymentStatus(
        desired=demand.replicas,
        min_replicas=demand.min_replicas,
        available=existing,
        retained=existing,
        new=0,
        phase=Phase.SCHEDULE_FAILED,
        reason=StatusReason.INVALID_NODE_SELECTOR,
        message=f"invalid nodeSelector CEL expression {error.expression!r} at line {error.line}, column "
        f"{error.column}: {error.reason}",
        clusters_checked=0,
        clusters=[],
        selector_error=SelectorProblem(
            expression=error.expression, line=error.line, column=error.column, message=error.reason
        ),
    )
