"""Rule 5: place the shortfall one replica at a time, spreading before packing.

Each new replica goes to the eligible cluster hosting the fewest replicas of this deployment, ties by cluster name,
and takes the lowest index not held on that cluster; the ledger is charged before the next one is placed. Eligible
means: matches clusterSelector, Ready, has a gateway address, no untolerated NoSchedule or NoExecute taint, and its
pools can host every engine (`engines.py`). Filling stops when no cluster can take another replica; the result is
then partial, not an error.

The search is a heap keyed by (load, name) rather than a scan of every cluster per replica. It picks the same
cluster a scan would: a cluster's ledger changes only when a replica lands on it, so a cluster that cannot host a
replica now never can later in the pass and leaves the heap for good, with its refusal recorded.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contracts.fleet_plan import ClusterReason
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica
from scheduler.deployment import tolerations
from scheduler.deployment.demand import Demand
from scheduler.deployment.draining import cluster_draining
from scheduler.deployment.engines import EngineChoice, Refusal, place_engines
from scheduler.deployment.ledger import Ledger
from scheduler.deployment.matching import Matcher
from scheduler.deployment.pools import Pool, gateway_address, is_ready, not_ready_message


@dataclass(frozen=True)
class NewReplica:
    cluster: str
    index: int
    engines: list[EngineChoice]


@dataclass(frozen=True)
class Filled:
    placed: list[NewReplica]
    refusals: dict[str, Refusal]  # every selected cluster that took no further replica, when the fill fell short


def ineligibility(cluster: InferenceCluster, demand: Demand) -> Refusal | None:
    """Why a selected cluster takes no new replica whatever its capacity, or None."""
    if not is_ready(cluster):
        why = not_ready_message(cluster)
        return Refusal(ClusterReason.NOT_READY, "the cluster is not Ready" + (f": {why}" if why else ""))
    if gateway_address(cluster) is None:
        return Refusal(ClusterReason.NO_GATEWAY_ADDRESS, "the cluster has no gateway address")
    draining = cluster_draining(cluster)
    if draining is not None:
        return Refusal(ClusterReason.DRAINING, draining)
    blocking = tolerations.untolerated(cluster.spec.taints, demand.tolerations, tolerations.BLOCKS_NEW)
    if blocking:
        return Refusal(ClusterReason.UNTOLERATED_TAINT, f"untolerated taint {tolerations.describe(blocking)}")
    return None


def fill(
    demand: Demand,
    clusters: Mapping[str, InferenceCluster],
    selected: Mapping[str, tuple[Pool, ...]],
    kept: Sequence[ModelReplica],
    ledger: Ledger,
    matcher: Matcher,
    replacements: int = 0,
) -> Filled:
    """`replacements`: replicas to place beyond the shortfall, for kept ones that are moving off draining capacity."""
    shortfall = demand.replicas - len(kept) + replacements
    load: dict[str, int] = {}
    held: dict[str, set[int]] = {}
    for replica in kept:
        name = replica.cluster or ""
        load[name] = load.get(name, 0) + 1
        held.setdefault(name, set()).add(replica.index)

    refusals: dict[str, Refusal] = {}
    heap: list[tuple[int, str]] = []
    for name in selected:
        refusal = ineligibility(clusters[name], demand)
        if refusal is None:
            heap.append((load.get(name, 0), name))
        else:
            refusals[name] = refusal
    heapq.heapify(heap)

    placed: list[NewReplica] = []
    while len(placed) < shortfall and heap:
        count, name = heapq.heappop(heap)
        choices = place_engines(selected[name], demand, matcher, ledger)
        if isinstance(choices, Refusal):
            refusals[name] = choices
            continue
        indices = held.setdefault(name, set())
        index = next(i for i in range(len(indices) + 1) if i not in indices)
        indices.add(index)
        for choice in choices:
            ledger.apply(choice.pool, choice.charge)
        placed.append(NewReplica(cluster=name, index=index, engines=choices))
        heapq.heappush(heap, (count + 1, name))
    return Filled(placed=placed, refusals=refusals if len(placed) < shortfall else {})
