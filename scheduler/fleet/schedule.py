"""The fleet scheduler for one ModelDeployment: a pure function of the deployment, the clusters, the classes and
every existing replica of every deployment. Same inputs, same plan: inputs are put in name order before use.

The steps, each in its own module, in the order they run:

    retain -> scale down -> ledger -> fill (engine and pool matching inside) -> status
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleet.deployment import ModelDeployment
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica
from scheduler.cel import SelectorCompileError
from scheduler.fleet.demand import compile_demand
from scheduler.fleet.fill import fill
from scheduler.fleet.ledger import build_ledger
from scheduler.fleet.matching import Matcher
from scheduler.fleet.placements import new_placement, retained_placement
from scheduler.fleet.pools import gateway_address, matches_labels, published_pools
from scheduler.fleet.results import FleetPlan
from scheduler.fleet.retain import retain
from scheduler.fleet.scale_down import scale_down
from scheduler.fleet.selectors import DeviceSelectors
from scheduler.fleet.status import deployment_status, invalid_selector_status


def schedule_deployment(
    deployment: ModelDeployment,
    clusters: Iterable[InferenceCluster],
    classes: Mapping[str, InferenceClass],
    replicas: Iterable[ModelReplica],
) -> FleetPlan:
    """Where every replica of `deployment` runs: the replicas kept, the new ones, the ones to remove, and why."""
    demand = compile_demand(deployment)
    replicas = sorted(replicas, key=lambda r: r.metadata.name)
    ours = [r for r in replicas if r.deployment == demand.deployment]
    by_name = {c.metadata.name: c for c in sorted(clusters, key=lambda c: c.metadata.name)}
    gateways = {name: gateway_address(cluster) for name, cluster in by_name.items()}

    try:
        selectors = DeviceSelectors(demand.selector_expressions())
    except SelectorCompileError as error:
        return FleetPlan(
            deployment=demand.deployment,
            replicas=[retained_placement(r, gateways.get(r.cluster or "")) for r in ours],
            dropped=[],
            status=invalid_selector_status(demand, len(ours), error),
        )
    matcher = Matcher(classes, selectors)

    selected = {
        name: published_pools(cluster) for name, cluster in by_name.items() if matches_labels(cluster, demand.match_labels)
    }
    retention = retain(demand, ours, by_name, selected, matcher)
    scaled = scale_down(retention.kept, demand.replicas)
    placed = []
    refusals = {}
    if len(scaled.kept) < demand.replicas:
        ledger = build_ledger(demand.deployment, scaled.kept, replicas)
        filled = fill(demand, by_name, selected, scaled.kept, ledger, matcher)
        placed, refusals = filled.placed, filled.refusals

    kept = sorted(scaled.kept, key=lambda r: (r.cluster or "", r.index))
    new = sorted(placed, key=lambda r: (r.cluster, r.index))
    return FleetPlan(
        deployment=demand.deployment,
        replicas=[retained_placement(r, gateways[r.cluster or ""]) for r in kept]
        + [new_placement(demand.deployment, r, gateways[r.cluster]) for r in new],
        dropped=retention.dropped + scaled.dropped,
        status=deployment_status(demand, len(kept), len(new), len(selected), refusals),
    )
