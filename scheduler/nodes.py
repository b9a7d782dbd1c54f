"""Node feasibility and ranking (cluster scheduler, second half): the chosen node and its alternates.

Nodes are judged by the node filter chain over their profiles, group by group (nodes of a pool that share a
profile share a verdict and a score), so the cost of a request grows with the number of distinct profiles, not
nodes. Ranking, smaller first:

- slices, binpack (default): partly used nodes before wholly free ones, so whole nodes stay free for bare metal;
  then nodes where the request fits on one NUMA node; then the fewest compatible free bundles (best fit).
- slices, spread: nodes where the request fits on one NUMA node, then the most compatible free bundles.
- bare metal: every fitting host ranks the same (its size is exactly the request).

A request that pins nodes (`PlacementRequest.nodes`) drops every other node with `node_not_pinned` before any
filter runs (see `scheduler/pinning.py`); one that also pins GPUs judges its node on the pinned slots alone.

Equally ranked nodes are taken in a fixed order (pool, then the snapshot's group order, then name), rotated by the
request's seed: deterministic for one seed, spread across seeds.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate, groupby

from pydantic import BaseModel, ConfigDict

from scheduler.compatibility import NodeProfile
from scheduler.explanation import Level, LevelExplanation, Tally
from scheduler.node_filters import Judge, could_ever_fit, verdict
from scheduler.pinning import pinned_profile
from scheduler.reasons import Reason
from scheduler.request import CapacityShape, NumaPolicy, PlacementRequest, Ranking
from scheduler.snapshot import Snapshot
from scheduler.views import PoolView


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True)

    node: str
    pool: str  # cluster/pool
    cluster: str
    region: str
    free_bundles: int  # compatible free bundles on the node now


# (score, pool position, pool, node names, profile): one run of nodes of one pool that rank the same.
_Feasible = tuple[tuple[int, ...], int, PoolView, tuple[str, ...], NodeProfile]


def score(node: NodeProfile, request: PlacementRequest) -> tuple[int, ...]:
    if request.shape is CapacityShape.BAREMETAL:
        return ()
    split = int(request.numa_policy is not NumaPolicy.NONE and node.best_numa_free < request.gpu_count)
    if request.ranking is Ranking.SPREAD:
        return (split, -node.compatible_free)
    return (int(node.wholly_free), split, node.compatible_free)


def describe(node: NodeProfile, pool: PoolView) -> str:
    return f"{pool.key}: {node.summary()}"


def rank_nodes(
    snapshot: Snapshot, pools: list[PoolView], request: PlacementRequest, *, detail: bool = False
) -> tuple[list[Candidate], LevelExplanation, bool]:
    """Up to 1 + `request.alternates` candidates in rank order, the node level's explanation, and whether any
    node of these pools could ever take the request (its hardware fits, whatever its current state)."""
    judge = Judge(request.shape, request.gpu_count, request.numa_policy)
    tally = Tally(Level.NODE, "nodes", f"can take {request.describe()}", request.gpu_count, detail)
    # Nodes this request may not use, by pool and profile group: those tried already, then those set aside for the
    # head of a queue (a node both tried and reserved counts as tried).
    excluded: dict[tuple[str, int], dict[str, Reason]] = {}
    for names, why in ((request.reserved_nodes, Reason.NODE_RESERVED), (request.exclude_nodes, Reason.NODE_EXCLUDED)):
        for name in names:
            for pool in snapshot.pools_of(name):
                excluded.setdefault((pool.key, snapshot.profile_key(name)), {})[name] = why

    pins = request.nodes
    scores: dict[int, tuple[int, ...]] = {}
    feasible: list[_Feasible] = []
    ever = False
    for ordinal, pool in enumerate(pools):
        for group in snapshot.groups(pool):
            profile, names = group.profile, group.nodes
            if pins:
                unpinned = [name for name in names if name not in pins]
                if unpinned:
                    tally.record(Reason.NODE_NOT_PINNED, unpinned, describe, profile, pool)
                    names = tuple(name for name in names if name in pins)
                if not names:
                    continue
            skip = excluded.get((pool.key, group.key))
            if skip:
                for why in (Reason.NODE_EXCLUDED, Reason.NODE_RESERVED):
                    if left_out := sorted(name for name in names if skip.get(name) is why):
                        tally.record(why, left_out, describe, profile, pool)
                names = tuple(name for name in names if name not in skip)
            if request.gpus and names:  # pinned GPUs: the one pinned node is judged on those slots alone
                profile = pinned_profile(snapshot.nodes[names[0]], request.gpus)
                reason, possible = verdict(profile, judge.filters), could_ever_fit(profile, judge.filters)
            else:
                reason = judge.verdict(group)
                possible = reason is None or judge.could_ever_fit(group)
            tally.record(reason, names, describe, profile, pool)
            ever = ever or possible
            if reason is None and names:
                if group.key not in scores:
                    scores[group.key] = score(profile, request)
                feasible.append((scores[group.key], ordinal, pool, names, profile))

    chosen: dict[str, Candidate] = {}
    for pool, name, profile in _in_rank_order(feasible, request.seed):
        if len(chosen) == 1 + request.alternates:
            break
        if name not in chosen:
            chosen[name] = Candidate(
                node=name, pool=pool.key, cluster=pool.cluster, region=pool.region, free_bundles=profile.compatible_free
            )
    return list(chosen.values()), tally.explanation(), ever


def _in_rank_order(feasible: list[_Feasible], seed: int | None) -> Iterator[tuple[PoolView, str, NodeProfile]]:
    """Feasible nodes best first. A run of equal scores (possibly across pools) is walked in its fixed order from a
    position the seed picks, wrapping around: O(log groups) per node taken, however many nodes the run holds."""
    feasible.sort(key=lambda entry: (entry[0], entry[1]))
    for _, tied in groupby(feasible, key=lambda entry: entry[0]):
        members = list(tied)
        ends = list(accumulate(len(entry[3]) for entry in members))
        total = ends[-1]
        offset = seed % total if seed is not None else 0
        for step in range(total):
            position = (offset + step) % total
            member = bisect_right(ends, position)
            _, _, pool, names, profile = members[member]
            yield pool, names[position - (ends[member - 1] if member else 0)], profile
