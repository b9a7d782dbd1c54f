"""One scheduling pass over a snapshot, top to bottom: tenant and region, pools and nodes, and a preview of the
node scheduler's plan on the chosen node.

The allocation workflow runs the region and cluster levels as one control step (`choose_placement` in
activities/control/placement.py), then the node agent's own `plan_bundles`; `schedule` strings all three together
for the dry-run `explain` endpoint, the offline `berth explain` and tests, so all of them tell the same story with
the same counts.
"""

from __future__ import annotations

from contracts.explanation import Explanation, LevelExplanation, Refusal
from contracts.placement import (
    PlacementRequest,
    PlacementResult,
    PlanRequest,
)
from scheduler.cel import RequestBudget, request_budget
from scheduler.placement.bundles import plan_bundles
from scheduler.placement.cluster import find_candidates
from scheduler.placement.region import select_region
from scheduler.snapshot import Snapshot

PlacementResult.model_rebuild()


def _refused(region: str | None, refusal: Refusal, levels: list[LevelExplanation]) -> PlacementResult:
    return PlacementResult(
        placed=False,
        region=region,
        candidates=[],
        plan=None,
        refusal=refusal,
        explanation=Explanation(summary=refusal.message, levels=levels),
    )


def schedule(
    snapshot: Snapshot, request: PlacementRequest, *, detail: bool = False, budget: RequestBudget | None = None
) -> PlacementResult:
    """Place `request` on `snapshot`, or say level by level why not. `detail` adds per-item verdicts.

    The whole pass charges one CEL cost budget (`budget`, a fresh one by default): raises
    `scheduler.cel.SelectorCostExceeded` when the request's selectors pass it (a bad request, like a selector that
    does not compile)."""
    with request_budget(budget):
        return _schedule(snapshot, request, detail)


def _schedule(snapshot: Snapshot, request: PlacementRequest, detail: bool) -> PlacementResult:
    regional = select_region(snapshot, request, detail=detail)
    levels = list(regional.levels)
    if regional.refusal is not None:
        return _refused(None, regional.refusal, levels)
    assert regional.region is not None  # a decision without a refusal names its region

    found = find_candidates(snapshot, request, regional.region, detail=detail)
    levels += found.levels
    if found.refusal is not None:
        return _refused(regional.region, found.refusal, levels)

    chosen = found.candidates[0]
    intent = PlanRequest(
        gpu_count=request.gpu_count, shape=request.shape, numa_policy=request.numa_policy, gpus=request.gpus
    )
    preview = plan_bundles(snapshot.nodes[chosen.node], intent, detail=detail)
    levels.append(preview.explanation)
    alternates = len(found.candidates) - 1
    summary = (
        f"{request.describe()} fit on node {chosen.node} in pool {chosen.pool} ({regional.region}), "
        f"with {alternates} alternate{'s' if alternates != 1 else ''}"
    )
    return PlacementResult(
        placed=True,
        region=regional.region,
        candidates=found.candidates,
        plan=preview.plan,
        refusal=None,
        explanation=Explanation(summary=summary, levels=levels),
    )
