"""The cluster scheduler: inside one region, the pools that can serve a request and the ranked candidate nodes.

It picks nodes by how many compatible bundles they could give, never the exact GPU, VF, NVMe or MAC tuple: that is
the node scheduler's decision, made on the host under a lease (docs/seeds.md, "Four layers, each deciding only what
it knows"). The workflow tries the candidates in order, so alternates make a node that changed under us cost one
attempt, not a whole new scheduling pass.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict

from contracts.explanation import LevelExplanation, Refusal
from contracts.placement import Candidate, PlacementRequest
from contracts.reasons import Reason
from contracts.vocabulary import NodeStatus
from scheduler.placement.node_filters import Judge
from scheduler.placement.nodes import pools_in_classes, rank_classes
from scheduler.placement.pinning import pinned_refusal
from scheduler.placement.pools import filter_pools, judge_pool_classes
from scheduler.snapshot import Snapshot
from scheduler.views import NodeView, PoolView


class CandidateDecision(BaseModel):
    model_config = ConfigDict(frozen=True)

    candidates: list[Candidate]  # the chosen node first, then the alternates
    refusal: Refusal | None
    levels: list[LevelExplanation]


def find_candidates(
    snapshot: Snapshot, request: PlacementRequest, region: str, *, detail: bool = False
) -> CandidateDecision:
    """Refusals: `no_matching_pool` when no pool of the region serves the request (`quota_exceeded` when some would
    but for the tenant's quota for their product); `no_compatible_bundles` when no
    node of the matching pools could ever take it as built; `insufficient_capacity` when some could, but not now;
    `pinned_nodes_unavailable` instead of any of these when the request pins nodes."""
    classes, pool_level = judge_pool_classes(snapshot, request, region, detail=detail)
    if not classes:
        # Pools that only the tenant's per-product quota refused: the request may wait for that quota.
        code = Reason.QUOTA_EXCEEDED if pool_level.dropped.get(Reason.QUOTA_EXCEEDED) else Reason.NO_MATCHING_POOL
        refusal = Refusal(code=code, message=f"{region}: {pool_level.summary}")
        if request.nodes:
            refusal = _pinned_refusal(snapshot, request, region, [])
        return CandidateDecision(candidates=[], refusal=refusal, levels=[pool_level])
    candidates, node_level, could_fit = rank_classes(snapshot, classes, request, detail=detail)
    refusal = None
    if not candidates:
        code = Reason.INSUFFICIENT_CAPACITY if could_fit else Reason.NO_COMPATIBLE_BUNDLES
        refusal = Refusal(code=code, message=f"{region}: {node_level.summary}")
        if request.nodes:
            refusal = _pinned_refusal(snapshot, request, region, pools_in_classes(snapshot, classes))
    return CandidateDecision(candidates=candidates, refusal=refusal, levels=[pool_level, node_level])


def _pinned_refusal(snapshot: Snapshot, request: PlacementRequest, region: str, pools: list[PoolView]) -> Refusal:
    """Pinned nodes that cannot take the request refuse it, each with its own reason; it never goes elsewhere."""
    _, detailed = filter_pools(snapshot, request, region, detail=True)
    reasons = {item.name: item.reason for item in detailed.items or [] if item.reason is not None}
    return pinned_refusal(snapshot, request, region, pools, reasons)


def nodes_that_could_hold(
    snapshot: Snapshot, request: PlacementRequest, region: str, *, now: bool = True
) -> Iterator[NodeView]:
    """The READY nodes of the pools serving `request` whose hardware could ever take it (only the pinned ones, if it
    pins). `now`: also with a live agent, and neither excluded nor held for a queue's head (a node for a decision
    now, not for a future window). For the queue's reservations, preemption and reservations' admission."""
    pools, _ = filter_pools(snapshot, request, region)
    judge = Judge(request.shape, request.gpu_count, request.numa_policy)
    seen: set[str] = set()
    for pool in pools:
        for group in snapshot.groups(pool):
            if not judge.could_ever_fit(group):
                continue
            for name in group.nodes:
                node = snapshot.nodes[name]
                if name in seen or node.status is not NodeStatus.READY or (request.nodes and name not in request.nodes):
                    continue
                if now and (not node.agent_live or name in request.exclude_nodes or name in request.reserved_nodes):
                    continue
                seen.add(name)
                yield node
