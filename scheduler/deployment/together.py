"""Every replica of a deployment on one cluster, or on one node group, instead of spreading (docs/seeds.md, "A model
on one cluster" and "One node group for every replica").

Two opt-in options under `spec.template.spec` (Modelplane spreads, so both are off by default):

- `singleCluster: true`, Seldon's "a model is assigned to at most one server, which therefore needs enough replicas
  to host all replicas of the model": every replica on one cluster.
- `homogeneous: true`, KAITO's NodeGroupSizeFilter: every replica's engine on the same node group (a pool is one
  node group: one InferenceClass, or one GFD label set for NodeList pools) of one cluster, and that group must have
  free nodes for all of them. Implies one cluster.

Clusters are tried in order: the ones already hosting replicas of this deployment first (most replicas first, so
the cluster already hosting the model is preferred and nothing flip-flops), then by name. The first that holds every
replica wins. If none does, the one holding the most wins when that is at least `minReplicas` (partial scheduling);
without `minReplicas` every replica must fit. Otherwise nothing changes: no replica is placed or removed, and the
status is `NoSingleCluster` or `NoSuitableNodeGroup` (with KAITO's denial message), each cluster saying how many
replicas it could hold and why no more. When a cluster is chosen, replicas of this deployment elsewhere (or, with
`homogeneous`, on another node group) are removed (delete plus create, as any move).

Each try works on a fork of the ledger, so a cluster tried and not chosen charges nothing. Engines pick their node
group greedily in engine order, as `engines.py` picks pools: the first group in published order (or by
`placementStrategy`) with room for every replica still needed, else the one with room for the most.

Replicas moving off a draining cluster or pool (`moves.py`) move here as they do without these options: one
replacement at a time, the replica it replaces kept (and serving) until `moves.py` removes it. Keeping a model on
one server must not stop the drain, as Seldon moves a model off a draining server replica onto a free one. A moving
replica counts toward no cluster or node group, so a cluster holds every replica when it has room for those not
settled there, and it is never removed for being on another cluster or group: it goes once it is replaced.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from contracts.fleet_plan import ClusterReason, DroppedReplica, DropReason, StatusReason
from fleet.deployment import PlacementStrategy
from fleet.inference_cluster import InferenceCluster
from fleet.replica import ModelReplica, ReplicaEngine
from scheduler.deployment.demand import Demand
from scheduler.deployment.engines import Refusal, place_engines, strategy_key
from scheduler.deployment.fill import Filled, NewReplica, ineligibility
from scheduler.deployment.ledger import Ledger
from scheduler.deployment.matching import EngineFit, Matcher
from scheduler.deployment.pools import Pool

KAITO_DENIAL = "No suitable node group found: insufficient capacity or no matching configurations after filtering."


@dataclass(frozen=True)
class Together:
    kept: list[ModelReplica]
    dropped: list[DroppedReplica]
    filled: Filled
    refused: tuple[StatusReason, str] | None  # set when no cluster (or node group) was chosen


@dataclass
class _Try:
    cluster: str
    kept: list[ModelReplica]  # replicas settled here (on the node group, with homogeneous)
    elsewhere: list[ModelReplica]  # replicas on this cluster but another node group (homogeneous)
    placed: list[NewReplica] = field(default_factory=list)  # placed now
    room: int = 0  # new replicas the cluster has room for, beyond those placed now while a move waits its turn
    refusal: Refusal | None = None
    pins: dict[str, str] | None = None

    @property
    def holds(self) -> int:
        return len(self.kept) + len(self.placed) + self.room


def fill_together(
    demand: Demand,
    clusters: Mapping[str, InferenceCluster],
    selected: Mapping[str, tuple[Pool, ...]],
    kept: Sequence[ModelReplica],
    ledger: Ledger,
    matcher: Matcher,
    moving: Collection[str] = (),
    replacements: int = 0,
) -> Together:
    """`kept` includes the replicas moving off draining capacity that are still needed (`moving`, by name), and
    `replacements` is how many replacements for them may be placed now (`moves.py`)."""
    target = demand.replicas
    floor = demand.min_replicas if demand.min_replicas is not None else target
    travelling = [r for r in kept if r.metadata.name in moving]
    by_cluster: dict[str, list[ModelReplica]] = {}
    for replica in sorted(kept, key=lambda r: r.index):
        if replica.metadata.name not in moving:
            by_cluster.setdefault(replica.cluster or "", []).append(replica)
    order = sorted(selected, key=lambda name: (-len(by_cluster.get(name, [])), name))

    tries: list[_Try] = []
    chosen: _Try | None = None
    for name in order:
        here = by_cluster.get(name, [])
        attempt = _try(demand, clusters[name], selected[name], here, travelling, replacements, ledger, matcher)
        tries.append(attempt)
        if attempt.holds >= target:
            chosen = attempt
            break
    if chosen is None and tries:
        best = max(tries, key=lambda t: t.holds)  # max keeps the first of equals: the preferred order
        if best.holds >= floor and best.holds > 0:
            chosen = best

    if chosen is None:
        return Together(
            kept=list(kept),
            dropped=[],
            filled=Filled(placed=[], refusals={t.cluster: _verdict(t, target) for t in tries}),
            refused=_refusal(demand, tries, target, floor),
        )
    refusals = {t.cluster: _verdict(t, target) for t in tries} if chosen.holds < target else {}
    stays = {r.metadata.name for r in [*chosen.kept, *travelling]}
    return Together(
        kept=[*chosen.kept, *travelling],
        dropped=[_moved(r, demand, chosen) for r in kept if r.metadata.name not in stays],
        filled=Filled(placed=chosen.placed, refusals=refusals),
        refused=None,
    )


def _try(
    demand: Demand,
    cluster: InferenceCluster,
    pools: tuple[Pool, ...],
    here: list[ModelReplica],
    travelling: Sequence[ModelReplica],
    replacements: int,
    ledger: Ledger,
    matcher: Matcher,
) -> _Try:
    """`here`: the replicas settled on the cluster; `travelling`: the replicas moving off draining capacity that are
    still needed, wherever they are. The cluster must have room for every replica not settled on it (`need`), but
    only `now` of them are placed: the replicas still moving serve until `replacements` at a time replace them."""
    name = cluster.metadata.name
    attempt = _Try(cluster=name, kept=list(here), elsewhere=[])
    if demand.homogeneous and here:
        reference = {e.name: _pool_of(e) for e in here[0].spec.engines}
        attempt.pins = {k: v for k, v in reference.items() if v is not None}
        attempt.kept = [r for r in here if {e.name: _pool_of(e) for e in r.spec.engines} == reference]
        names = {r.metadata.name for r in attempt.kept}
        attempt.elsewhere = [r for r in here if r.metadata.name not in names]
    need = demand.replicas - len(attempt.kept)
    if need <= 0:
        return attempt
    now = min(need, max(0, need - len(travelling) + replacements)) if travelling else need
    refusal = ineligibility(cluster, demand)
    if refusal is not None:
        attempt.refusal = refusal
        return attempt
    fork = ledger.fork()
    if demand.homogeneous and attempt.pins is None:
        groups = _node_groups(demand, pools, matcher, fork, need)
        if isinstance(groups, Refusal):
            attempt.refusal = groups
            return attempt
        attempt.pins = groups
    held = {r.index for r in [*attempt.kept, *travelling] if r.cluster == name}  # names of replicas that stay
    while len(attempt.placed) + attempt.room < need:
        choices = place_engines(pools, demand, matcher, fork, attempt.pins)
        if isinstance(choices, Refusal):
            attempt.refusal = choices
            break
        for choice in choices:
            fork.apply(choice.pool, choice.charge)
        if len(attempt.placed) < now:
            index = next(i for i in range(len(held) + 1) if i not in held)
            held.add(index)
            attempt.placed.append(NewReplica(cluster=name, index=index, engines=choices))
        else:  # room kept for a replica still moving: placed once the one before it is replaced
            attempt.room += 1
    return attempt


def _node_groups(
    demand: Demand, pools: tuple[Pool, ...], matcher: Matcher, ledger: Ledger, need: int
) -> dict[str, str] | Refusal:
    """Per engine, the node group (pool) all `need` new replicas use: the first (by resource-fit rank, then
    placementStrategy, then published order) with room for all of them, else the one with room for the most."""
    scratch = ledger.fork()  # what the groups chosen for earlier engines will take
    pins: dict[str, str] = {}
    for engine in demand.engines:
        best: tuple[tuple[int, int, int, int], Pool, Ledger] | None = None  # (rank key, group, ledger with it taken)
        for position, pool in enumerate(pools):
            fit = matcher.engine(engine, pool.class_name)
            if isinstance(fit, str):
                continue
            room, left, taken = _room(scratch, pool, fit, need, demand.strategy)
            key = (-room, fit.rank, strategy_key(demand.strategy, left), position)
            if best is None or key < best[0]:
                best = (key, pool, taken)
        if best is None:
            why = "; ".join(
                f"pool {p.name}: {f}" for p in pools if isinstance(f := matcher.engine(engine, p.class_name), str)
            )
            return Refusal(
                ClusterReason.NO_MATCHING_POOL, f"engine {engine.name}: {why or 'the cluster publishes no pools'}"
            )
        _, pool, scratch = best
        pins[engine.name] = pool.name
    return pins


def _room(
    ledger: Ledger, pool: Pool, fit: EngineFit, need: int, strategy: PlacementStrategy | None
) -> tuple[int, int, Ledger]:
    """How many of `need` copies of the engine the group holds, what it has left then, and a ledger with them
    taken. Whole-node engines divide; GPU-level ones are placed one after another, as the fill would."""
    taken = ledger.fork()
    if not fit.gpus:
        free = ledger.free(pool)
        room = max(0, min(free // fit.nodes, need)) if fit.nodes else need
        taken.charge(pool.cluster, pool.name, room * fit.nodes)
        return room, free - room * fit.nodes, taken
    room, left = 0, 0
    while room < need:
        charge = taken.plan(pool, fit.nodes, fit.gpus, strategy)
        if isinstance(charge, str):
            break
        taken.apply(pool, charge)
        room, left = room + 1, charge.left
    return room, left, taken


def _pool_of(engine: ReplicaEngine) -> str | None:
    return next((m.node_pool_name for m in engine.members if m.node_pool_name), None)


def _verdict(attempt: _Try, target: int) -> Refusal:
    why = attempt.refusal or Refusal(ClusterReason.INSUFFICIENT_NODES, "no further replica fits")
    groups = f" on node group {', '.join(sorted(set(attempt.pins.values())))}" if attempt.pins else ""
    return Refusal(why.reason, f"holds {attempt.holds} of {target} replicas{groups}: {why.message}")


def _refusal(demand: Demand, tries: list[_Try], target: int, floor: int) -> tuple[StatusReason, str]:
    wanted = f"{target} replicas" + (f" (or minReplicas {floor})" if floor < target else "")
    best = max(tries, key=lambda t: t.holds) if tries else None
    most = "no cluster is selected"
    if best is not None:
        group = f" node group {', '.join(sorted(set(best.pins.values())))} of" if best.pins else ""
        most = f"the most is {best.holds} on{group} cluster {best.cluster}"
    if demand.homogeneous:
        return StatusReason.NO_SUITABLE_NODE_GROUP, f"{KAITO_DENIAL} No node group holds {wanted}: {most}"
    return StatusReason.NO_SINGLE_CLUSTER, f"no single cluster can hold {wanted} (singleCluster): {most}"


def _moved(replica: ModelReplica, demand: Demand, chosen: _Try) -> DroppedReplica:
    if replica.cluster == chosen.cluster:
        reason, where = (
            DropReason.OTHER_NODE_GROUP,
            f"node group {', '.join(sorted(set((chosen.pins or {}).values())))}",
        )
        message = f"homogeneous: the deployment runs on {where} of cluster {chosen.cluster}"
    else:
        option = "homogeneous" if demand.homogeneous else "singleCluster"
        reason, message = DropReason.SINGLE_CLUSTER, f"{option}: the deployment runs on cluster {chosen.cluster}"
    return DroppedReplica(
        name=replica.metadata.name, cluster=replica.cluster, index=replica.index, reason=reason, message=message
    )
