"""Rule 6: put every engine of one new replica on a pool of one cluster, never splitting an engine across pools.

Engines are placed in order. Each takes the first pool, in published order, that hosts all its members (see
`matching.py`) and still has room for its whole cost (free nodes; for GPU-level members, GPUs on one node per pod:
`ledger.py`); a pool taken by an earlier engine of the same replica shows the nodes that engine used. Two
refinements come from GPUStack and apply only when asked for: pools where a member's memory need fits at an
earlier resource-fit step are preferred (docs/seeds.md, "Resource fit from a memory need"), and
`placementStrategy` picks among the fitting pools the one left with the fewest (binpack) or the most (spread) free
nodes (docs/seeds.md, "Binpack and spread"); under spread, GPU-level pods go first to a pool where they need no
node another instance uses, as within a pool. Greedy, like Modelplane: it may miss an assignment a search would
find when engines compete for one pool, and never overcommits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contracts.fleet_plan import ClusterReason
from fleet.deployment import PlacementStrategy
from scheduler.deployment.demand import Demand, EngineDemand
from scheduler.deployment.ledger import Charge, Ledger
from scheduler.deployment.matching import EngineFit, Matcher
from scheduler.deployment.pools import Pool


@dataclass(frozen=True)
class EngineChoice:
    engine: EngineDemand
    pool: Pool
    fit: EngineFit
    charge: Charge  # what it takes of the pool: whole nodes, and the GPU-level pods' nodes


@dataclass(frozen=True)
class Refusal:
    reason: ClusterReason
    message: str


def place_engines(
    pools: Sequence[Pool], demand: Demand, matcher: Matcher, ledger: Ledger, pins: Mapping[str, str] | None = None
) -> list[EngineChoice] | Refusal:
    """`pins` (engine name -> pool name) restricts each engine to one pool, as homogeneous placement needs. Nothing
    is charged to `ledger`: the caller applies the choices' charges (`Ledger.apply`) once the replica is kept."""
    scratch = ledger.fork()  # the engines placed so far for this replica, so later ones see what they took
    choices: list[EngineChoice] = []
    for engine in demand.engines:
        best: tuple[tuple[int, ...], Pool, EngineFit, Charge] | None = None
        for position, pool in enumerate(pools):
            if pins is not None and pins.get(engine.name) != pool.name:
                continue
            fit = matcher.engine(engine, pool.class_name)
            if isinstance(fit, str):
                continue
            charge = scratch.plan(pool, fit.nodes, fit.gpus, demand.strategy)
            if isinstance(charge, str):
                continue
            key = (fit.rank, *_pool_key(demand.strategy, charge), position)
            if best is None or key < best[0]:
                best = (key, pool, fit, charge)
            if demand.strategy is None and fit.rank == 0:
                break
        if best is None:
            allowed = pools if pins is None else [p for p in pools if p.name == pins.get(engine.name)]
            return _refusal(engine, allowed, scratch, matcher, demand.strategy)
        _, pool, fit, charge = best
        scratch.apply(pool, charge)
        choices.append(EngineChoice(engine=engine, pool=pool, fit=fit, charge=charge))
    return choices


def _pool_key(strategy: PlacementStrategy | None, charge: Charge) -> tuple[int, ...]:
    """How `placementStrategy` ranks a pool that fits (lower first). Under spread, pools are ranked as a pool's own
    nodes are (`ledger.py`): a pool whose GPU-level pods land on nodes no other instance uses before one where they
    join other instances, GPUStack's spread scoring a worker without instances highest; among the latter, the one
    whose node has the most room; then the pool left with the most free. Otherwise by what the pool has left."""
    if strategy is PlacementStrategy.SPREAD:
        return charge.crowded, -charge.room, -charge.left
    return (strategy_key(strategy, charge.left),)


def strategy_key(strategy: PlacementStrategy | None, remaining: int) -> int:
    if strategy is PlacementStrategy.BINPACK:
        return remaining
    if strategy is PlacementStrategy.SPREAD:
        return -remaining
    return 0


def _refusal(
    engine: EngineDemand,
    pools: Sequence[Pool],
    ledger: Ledger,
    matcher: Matcher,
    strategy: PlacementStrategy | None,
) -> Refusal:
    """Why no pool hosts the engine, pool by pool. Built only on refusal, so placement itself stays cheap."""
    if not pools:
        return Refusal(ClusterReason.NO_MATCHING_POOL, "the cluster publishes no pools")
    reasons = []
    short = False
    for pool in pools:
        fit = matcher.engine(engine, pool.class_name)
        if isinstance(fit, str):
            reasons.append(f"pool {pool.name}: {fit}")
        else:
            short = True
            charge = ledger.plan(pool, fit.nodes, fit.gpus, strategy)
            left_out = f" (not counted: {'; '.join(pool.excluded)})" if pool.excluded else ""
            reasons.append(f"pool {pool.name}: {charge if isinstance(charge, str) else 'fits'}{left_out}")
    reason = ClusterReason.INSUFFICIENT_NODES if short else ClusterReason.NO_MATCHING_POOL
    return Refusal(reason, f"engine {engine.name}: " + "; ".join(reasons))
