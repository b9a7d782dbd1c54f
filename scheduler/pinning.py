"""Seed 001's GPU matching policy for allocations: a request that pins nodes is served by one of them or refused.

GPUStack users pick the GPUs a model runs on, and complain when the scheduler quietly runs it elsewhere (GPUStack
issue #915). So pinning is a hard filter, not a preference: every other node is dropped with `node_not_pinned`,
and when no pinned node can take the request now the refusal is `pinned_nodes_unavailable`, naming each pinned node
and why it cannot (unknown, in another region, in a pool that does not serve the request, excluded in this run, or
the node filter's own reason: not READY, full, cooling off...). The reasons are built only on refusal, so a pinned
request that is placed costs no more than any other.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.explanation import Refusal
from scheduler.node_filters import Judge
from scheduler.reasons import Reason, clause
from scheduler.request import PlacementRequest
from scheduler.snapshot import Snapshot
from scheduler.views import PoolView


def regions_of_pins(snapshot: Snapshot, pins: Iterable[str]) -> set[str]:
    """The regions holding at least one pinned node."""
    return {pool.region for name in pins for pool in snapshot.pools_of(name)}


def pinned_refusal(
    snapshot: Snapshot,
    request: PlacementRequest,
    region: str | None,
    pools: Iterable[PoolView] = (),
    pool_reasons: dict[str, Reason] | None = None,
) -> Refusal:
    """Why no pinned node takes the request. `pools` are the region's pools that serve the request (None: the
    region level refused before pools were looked at); `pool_reasons` says why each other pool was dropped."""
    serving = {pool.key: pool for pool in pools}
    judge = Judge(request.shape, request.gpu_count, request.numa_policy)
    why = [
        f"{name} {_reason(snapshot, request, region, name, serving, pool_reasons or {}, judge)}"
        for name in sorted(request.nodes)
    ]
    noun = "node" if len(request.nodes) == 1 else "nodes"
    return Refusal(
        code=Reason.PINNED_NODES_UNAVAILABLE,
        message=f"no pinned {noun} can take {request.describe()}: " + "; ".join(why),
    )


def _reason(
    snapshot: Snapshot,
    request: PlacementRequest,
    region: str | None,
    name: str,
    serving: dict[str, PoolView],
    pool_reasons: dict[str, Reason],
    judge: Judge,
) -> str:
    if name not in snapshot.nodes:
        return "is not a known node"
    pools = snapshot.pools_of(name)
    if not pools:
        return "is in no pool"
    if region is not None and all(pool.region != region for pool in pools):
        return f"is in region {', '.join(sorted({p.region for p in pools}))}, not {region}"
    if name in request.exclude_nodes:
        return clause(Reason.NODE_EXCLUDED, request.gpu_count) + " (already tried in this run)"
    mine = [pool for pool in pools if region is None or pool.region == region]
    usable = [pool for pool in mine if pool.key in serving]
    if not usable:
        return "is in " + ", ".join(_pool_refusal(pool, pool_reasons.get(pool.key), request) for pool in mine)
    key = snapshot.profile_key(name)
    for pool in usable:
        group = next(g for g in snapshot.groups(pool) if g.key == key)
        verdict = judge.verdict(group)
        if verdict is None:
            return "could take it"  # only reached if a caller asks about a request that was placed
        return clause(verdict, request.gpu_count)
    raise AssertionError("unreachable: usable pools are not empty")


def _pool_refusal(pool: PoolView, reason: Reason | None, request: PlacementRequest) -> str:
    if reason is None:
        return f"pool {pool.key}, which does not serve the request"
    return f"pool {pool.key}, which {clause(reason, request.gpu_count)}"
