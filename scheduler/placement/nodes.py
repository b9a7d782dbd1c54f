"""Node feasibility and ranking (cluster scheduler, second half): the chosen node and its alternates.

Nodes are judged by the node filter chain over their profiles, group by group (nodes of a pool that share a
profile share a verdict and a score), so the cost of a request grows with the number of distinct profiles, not
nodes. Ranking, smaller first:

- slices, binpack (default): partly used nodes before wholly free ones, so whole nodes stay free for bare metal;
  then nodes where the request fits on one NUMA node; then the fewest compatible free bundles (best fit).
- slices, spread: nodes where the request fits on one NUMA node, then the most compatible free bundles.
- bare metal: every fitting host ranks the same (its size is exactly the request).

A request that pins nodes (`PlacementRequest.nodes`) drops every other node with `node_not_pinned` before any
filter runs (see `scheduler/placement/pinning.py`); one that also pins GPUs judges its node on the pinned slots alone.

Equally ranked nodes are taken in a fixed order (pool, then the snapshot's group order, then name), rotated by the
request's seed: deterministic for one seed, spread across seeds.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, groupby

from contracts.explanation import Level, LevelExplanation
from contracts.placement import Candidate, CapacityShape, NumaPolicy, PlacementRequest, Ranking
from contracts.reasons import Reason
from scheduler.compatibility import NodeProfile
from scheduler.explanation import Tally
from scheduler.placement.node_filters import Judge, could_ever_fit, verdict
from scheduler.placement.pinning import pinned_profile
from scheduler.snapshot import PoolClass, Snapshot
from scheduler.views import PoolView

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


def rank_classes(
    snapshot: Snapshot, classes: list[PoolClass], request: PlacementRequest, *, detail: bool = False
) -> tuple[list[Candidate], LevelExplanation, bool]:
    """Up to 1 + `request.alternates` candidates in rank order over the pools of `classes` (pool classes of one
    region that passed `scheduler.placement.pools.judge_pool_classes`), the node level's explanation, and whether any node of
    these pools could ever take the request (its hardware fits, whatever its current state)."""
    if not detail and not request.nodes and not request.gpus:
        return _rank_by_class(snapshot, classes, request)
    return _rank_groups(snapshot, pools_in_classes(snapshot, classes), request, detail)


def pools_in_classes(snapshot: Snapshot, classes: list[PoolClass]) -> list[PoolView]:
    """The pools of `classes` (of one region), in snapshot order."""
    if not classes:
        return []
    ids = {pool_class.id for pool_class in classes}
    return [pool for pool in snapshot.pools_in(classes[0].pool.region) if snapshot.pool_class(pool.key).id in ids]


def _excluded(snapshot: Snapshot, request: PlacementRequest) -> dict[tuple[str, int], dict[str, Reason]]:
    """Nodes this request may not use, by pool and profile group: those tried already, then those set aside for the
    head of a queue (a node both tried and reserved counts as tried)."""
    excluded: dict[tuple[str, int], dict[str, Reason]] = {}
    for names, why in ((request.reserved_nodes, Reason.NODE_RESERVED), (request.exclude_nodes, Reason.NODE_EXCLUDED)):
        for name in names:
            for pool in snapshot.pools_of(name):
                excluded.setdefault((pool.key, snapshot.profile_key(name)), {})[name] = why
    return excluded


def _rank_groups(
    snapshot: Snapshot, pools: list[PoolView], request: PlacementRequest, detail: bool
) -> tuple[list[Candidate], LevelExplanation, bool]:
    """Group by group: for per-item detail, pinned nodes and pinned GPUs."""
    judge = Judge(request.shape, request.gpu_count, request.numa_policy)
    tally = Tally(Level.NODE, "nodes", f"can take {request.describe()}", request.gpu_count, detail)
    excluded = _excluded(snapshot, request)
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

    return _chosen(_in_rank_order(feasible, request.seed), request), tally.explanation(), ever


def _chosen(ranked: Iterator[tuple[PoolView, str, NodeProfile]], request: PlacementRequest) -> list[Candidate]:
    chosen: dict[str, Candidate] = {}
    for pool, name, profile in ranked:
        if len(chosen) == 1 + request.alternates:
            break
        if name not in chosen:
            chosen[name] = Candidate(
                node=name, pool=pool.key, cluster=pool.cluster, region=pool.region, free_bundles=profile.compatible_free
            )
    return list(chosen.values())


# --- The same answer from the snapshot's per-class profile counts and postings ------------------------------------
#
# Without per-item detail, pins or pinned GPUs, the node level needs, per reason, how many nodes of the pools have
# it, and the first nodes of the best scores in rank order. Both follow from each pool class's count of nodes per
# profile (`Snapshot.profile_counts`) and where they are (`Snapshot.postings`): the counts per reason and the
# feasible profiles by score are kept per class and kind of request for the snapshot (`_ClassVerdicts`), and the
# seed's position in a run of equal scores is found by bisection over the postings. A decision costs
# O(classes x profiles) once per snapshot and kind of request, then O(classes x log pools) plus the nodes it takes,
# instead of one step per node group (about 7,000 at 50,000 nodes). Excluded or reserved nodes in a run of the
# best score make that run walk its pools, as `_rank_groups` does.


@dataclass(frozen=True, slots=True)
class _ClassVerdicts:
    """One kind of request over one pool class: nodes per verdict, whether any node could ever take it, and the
    feasible profiles by score."""

    counts: dict[Reason | None, int]
    ever: bool
    feasible: dict[tuple[int, ...], tuple[int, ...]]  # score -> profile numbers


def _class_verdicts(
    snapshot: Snapshot, pool_class: PoolClass, request: PlacementRequest, judge: Judge
) -> _ClassVerdicts:
    def compute() -> _ClassVerdicts:
        counts: dict[Reason | None, int] = {}
        feasible: dict[tuple[int, ...], list[int]] = {}
        ever = False
        for key, nodes in snapshot.profile_counts(pool_class).items():
            reason, possible, rank = snapshot.profile_memo(key, kind, judged)
            counts[reason] = counts.get(reason, 0) + nodes
            ever = ever or possible
            if reason is None:
                feasible.setdefault(rank, []).append(key)
        return _ClassVerdicts(counts, ever, {rank: tuple(keys) for rank, keys in feasible.items()})

    def judged(profile: NodeProfile) -> tuple[Reason | None, bool, tuple[int, ...]]:
        reason = verdict(profile, judge.filters)
        possible = reason is None or could_ever_fit(profile, judge.filters)
        return reason, possible, score(profile, request) if reason is None else ()

    kind = ("node verdict", request.shape, request.gpu_count, request.numa_policy, request.ranking)
    return snapshot.memo((pool_class.id, *kind), compute)


def _rank_by_class(
    snapshot: Snapshot, classes: list[PoolClass], request: PlacementRequest
) -> tuple[list[Candidate], LevelExplanation, bool]:
    judge = Judge(request.shape, request.gpu_count, request.numa_policy)
    tally = Tally(Level.NODE, "nodes", f"can take {request.describe()}", request.gpu_count, False)
    verdicts = [_class_verdicts(snapshot, pool_class, request, judge) for pool_class in classes]
    counts: dict[Reason | None, int] = {}
    for entry in verdicts:
        for reason, nodes in entry.counts.items():
            counts[reason] = counts.get(reason, 0) + nodes
    ever = any(entry.ever for entry in verdicts)

    # Excluded and reserved nodes of these pools count under their own reason instead of their profile's verdict.
    ids = {pool_class.id for pool_class in classes}
    skipped: dict[tuple[str, int], dict[str, Reason]] = {}
    skipped_profiles: set[tuple[int, int]] = set()  # (class id, profile number)
    for (pool_key, key), names in _excluded(snapshot, request).items():
        class_id = snapshot.pool_class(pool_key).id
        if class_id not in ids:
            continue
        skipped[(pool_key, key)] = names
        skipped_profiles.add((class_id, key))
        reason = verdict(snapshot.profile(key), judge.filters)
        for why in names.values():
            counts[why] = counts.get(why, 0) + 1
            counts[reason] -= 1
    for reason, nodes in counts.items():
        tally.add(reason, nodes)

    by_score: dict[tuple[int, ...], list[tuple[PoolClass, tuple[int, ...]]]] = {}
    for pool_class, entry in zip(classes, verdicts, strict=True):
        for rank, keys in entry.feasible.items():
            by_score.setdefault(rank, []).append((pool_class, keys))

    def ranked() -> Iterator[tuple[PoolView, str, NodeProfile]]:
        pools: list[PoolView] | None = None
        for rank in sorted(by_score):
            members = by_score[rank]
            if any((pool_class.id, key) in skipped_profiles for pool_class, keys in members for key in keys):
                pools = pools if pools is not None else pools_in_classes(snapshot, classes)
                keys = {key for _, keys in members for key in keys}
                yield from _in_rank_order(_run(snapshot, pools, rank, keys, skipped), request.seed)
            else:
                yield from _walk(snapshot, members, request.seed)

    return _chosen(ranked(), request), tally.explanation(), ever


def _walk(
    snapshot: Snapshot, members: list[tuple[PoolClass, tuple[int, ...]]], seed: int | None
) -> Iterator[tuple[PoolView, str, NodeProfile]]:
    """The nodes of one run of equal scores (these profiles of these classes, of one region), in the order
    `_in_rank_order` walks them: from the position the seed picks, in pool, group and name order, wrapping around.
    The seed's pool is found by bisection over the postings; each later pool by one bisection per posting."""
    postings = [found for pool_class, keys in members for key in keys if (found := snapshot.postings(pool_class, key))]
    total = sum(entry.ends[-1] for entry in postings)
    if not total:
        return
    region_pools = snapshot.pools_in(members[0][0].pool.region)
    keys_of = {pool_class.id: keys for pool_class, keys in members}

    def before(position: int) -> int:
        """Nodes of the run in the pools before `position`."""
        return sum(entry.ends[bisect_left(entry.positions, position)] for entry in postings)

    offset = seed % total if seed is not None else 0
    low, high = 0, len(region_pools) - 1  # the pool holding node `offset`: the first whose end is past it
    while low < high:
        middle = (low + high) // 2
        if before(middle + 1) > offset:
            high = middle
        else:
            low = middle + 1
    position, skip, given = low, offset - before(low), 0
    while True:
        pool = region_pools[position]
        at = snapshot.group_positions(pool)
        groups = snapshot.groups(pool)
        for index in sorted(at[key] for key in keys_of[snapshot.pool_class(pool.key).id] if key in at):
            group = groups[index]
            names = group.nodes
            if skip >= len(names):
                skip -= len(names)
                continue
            for name in names[skip:]:
                yield pool, name, group.profile
                given += 1
                if given == total:
                    return
            skip = 0
        following = [
            entry.positions[after]
            for entry in postings
            if (after := bisect_right(entry.positions, position)) < len(entry.positions)
        ]
        position = min(following) if following else min(entry.positions[0] for entry in postings)


def _run(
    snapshot: Snapshot,
    pools: list[PoolView],
    rank: tuple[int, ...],
    keys: set[int],
    skipped: dict[tuple[str, int], dict[str, Reason]],
) -> list[_Feasible]:
    """The feasible groups of one score, in pool then group order, less the nodes the request may not use: the run
    `_in_rank_order` walks, one step per pool."""
    run: list[_Feasible] = []
    for ordinal, pool in enumerate(pools):
        positions = snapshot.group_positions(pool)
        found = [positions[key] for key in keys if key in positions]
        if not found:
            continue
        if len(found) > 1:
            found.sort()
        groups = snapshot.groups(pool)
        for position in found:
            group = groups[position]
            names = group.nodes
            skip = skipped.get((pool.key, group.key))
            if skip:
                names = tuple(name for name in names if name not in skip)
            if names:
                run.append((rank, ordinal, pool, names, group.profile))
    return run


def _in_rank_order(feasible: list[_Feasible], seed: int | None) -> Iterator[tuple[PoolView, str, NodeProfile]]:
    """Feasible nodes best first. A run of equal scores (possibly across pools) is walked in its fixed order from a
    position the seed picks, wrapping around: O(log groups) per node taken, however many nodes the run holds."""
    if not feasible:
        return
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
