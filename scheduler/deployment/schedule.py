"""The fleet scheduler for one ModelDeployment: a pure function of the deployment, the clusters, the classes and
every existing replica of every deployment. Same inputs, same plan: inputs are put in name order before use.

The steps, each in its own module, in the order they run:

    retain -> scale down -> ledger -> fill (engine and pool matching inside) -> minReplicas -> status

With `singleCluster` or `homogeneous`, `together.py` takes the place of the fill: one cluster (and node group) for
every replica instead of spreading. Replicas moving off draining capacity move the same way under either: one
replacement at a time (`moves.py`).

Below minReplicas the fill's new replicas are held back (docs/seeds.md, "Partial scheduling above minReplicas"):
nothing new is placed, the retained replicas stay, and the status is ScheduleFailed saying how many could have
been placed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from contracts.fleet_plan import FleetPlan
from fleet.deployment import ModelDeployment
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica
from scheduler.cel import SelectorCompileError
from scheduler.deployment.demand import compile_demand
from scheduler.deployment.draining import WithoutDrainingPools, split
from scheduler.deployment.fill import Filled, fill
from scheduler.deployment.ledger import build_ledger
from scheduler.deployment.matching import Matcher
from scheduler.deployment.moves import plan_moves, with_moves
from scheduler.deployment.placements import PlacementRecords
from scheduler.deployment.pools import SelectedPools, gateway_address
from scheduler.deployment.retain import retain
from scheduler.deployment.scale_down import scale_down
from scheduler.deployment.selectors import DeviceSelectors
from scheduler.deployment.status import deployment_status, invalid_selector_status
from scheduler.deployment.together import fill_together


def schedule_deployment(
    deployment: ModelDeployment,
    clusters: Iterable[InferenceCluster],
    classes: Mapping[str, InferenceClass],
    replicas: Iterable[ModelReplica],
    evicted: Mapping[str, str] | None = None,
) -> FleetPlan:
    """Where every replica of `deployment` runs: the replicas kept, the new ones, the ones to remove, and why.
    `evicted`: replicas (`<namespace>/<name>`) with a pod on a node tainted NoExecute, and why (moved)."""
    demand = compile_demand(deployment)
    observed = sorted(replicas, key=lambda r: r.metadata.name)
    ours = [r for r in observed if r.deployment == demand.deployment]
    by_name = {c.metadata.name: c for c in sorted(clusters, key=lambda c: c.metadata.name)}
    gateways = {name: gateway_address(cluster) for name, cluster in by_name.items()}

    records = PlacementRecords(demand.deployment)

    try:
        selectors = DeviceSelectors(demand.selector_expressions())
    except SelectorCompileError as error:
        return FleetPlan(
            deployment=demand.deployment,
            replicas=[records.retained(r, gateways.get(r.cluster or "")) for r in ours],
            dropped=[],
            status=invalid_selector_status(demand, len(ours), error),
        )
    matcher = Matcher(classes, selectors)

    selected = SelectedPools(by_name, demand.match_labels)
    retention = retain(demand, ours, by_name, selected, matcher, evicted)
    open_pools = WithoutDrainingPools(selected, by_name)  # where new replicas may go
    staying, moving = split(retention.kept, by_name)
    scaled = scale_down(staying, demand.replicas, demand.scale_down_order)
    moves = plan_moves(demand, scaled.kept, moving)
    survivors = [*scaled.kept, *moves.kept]
    filled = Filled(placed=[], refusals={})
    kept_replicas, moved, refused = survivors, [], None
    if demand.together:
        ledger = build_ledger(demand.deployment, survivors, observed)
        moving_names = {r.metadata.name for r in moves.kept}
        together = fill_together(
            demand, by_name, open_pools, survivors, ledger, matcher, moving_names, moves.replacements
        )
        kept_replicas, moved, filled, refused = together.kept, together.dropped, together.filled, together.refused
    elif len(survivors) < demand.replicas + moves.replacements:
        ledger = build_ledger(demand.deployment, survivors, observed)
        filled = fill(demand, by_name, open_pools, survivors, ledger, matcher, moves.replacements)
    held_back = 0
    if demand.min_replicas and len(kept_replicas) + len(filled.placed) < demand.min_replicas:
        # docs/seeds.md, "Partial scheduling above minReplicas": below it, place nothing new (retained replicas stay).
        held_back, filled = len(filled.placed), Filled(placed=[], refusals=filled.refusals)

    kept = sorted(kept_replicas, key=lambda r: (r.cluster or "", r.index))
    new = sorted(filled.placed, key=lambda r: (r.cluster, r.index))
    return FleetPlan(
        deployment=demand.deployment,
        replicas=[records.retained(r, gateways[r.cluster or ""]) for r in kept]
        + [records.new(r, gateways[r.cluster]) for r in new],
        dropped=retention.dropped + moves.dropped + scaled.dropped + moved,
        status=with_moves(
            deployment_status(
                # the replicas moving still serve, but are not counted: those staying and the new ones are
                demand,
                max(0, len(kept) - len(moves.kept)),
                len(new),
                len(selected),
                filled.refusals,
                held_back,
                refused,
            ),
            moves,
        ),
    )
