"""What would let a waiting request through: a short list of events the API already knows of, soonest first, next
to the reason the last admission pass recorded (api/queue_view.py puts them on each `GET /v1/queues` item).

    the region's holdings (running allocations and their lease ends) + open reservations' windows
      (store.reservations.window_facts, one read per region shown) + the inventory's snapshot (nodes, pools, quotas)
      -> per waiting request: the nodes it could use (its region's pools that pass its shape and product filters)
      -> release (the soonest lease ending there), reclaim (GPUs there borrowed beyond another tenant's quota),
         reservation_end (the soonest reservation window ending there), node_return (a node there that is away),
         quota (for a quota refusal: the soonest end among its own tenant's allocations)
      -> `nothing_known` when none applies: never a guess

No hint is a promise: a lease may be extended, a node may stay down. A tenant reading the queue never reads another
tenant's allocation id or name here: those are "a request of another tenant" and "another tenant".
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from contracts.http import QueueHint
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from contracts.vocabulary import NodeStatus, ReclaimWithinCohort, SlotState
from scheduler.admission.reservations import Holding, Reserved
from scheduler.host.health import HealthState
from scheduler.placement.pools import ProductFilter, ShapeFilter
from scheduler.quota.cohorts import root_of
from scheduler.snapshot import Snapshot
from store.queue import QueueEntry
from store.tokens import Principal

HIDDEN = "a request of another tenant"
MOST = 4  # hints per request: the soonest few, not an inventory
QUOTA_CODES = frozenset({Reason.QUOTA_EXCEEDED.value})


def candidate_nodes(snapshot: Snapshot, entry: QueueEntry) -> set[str]:
    """The nodes of the entry's region whose pool could serve it (its shape and product), narrowed to the nodes it
    pinned, if it pinned some."""
    request = PlacementRequest.model_validate(entry.request)
    nodes: set[str] = set()
    for pool in snapshot.pools:
        if pool.region != entry.region:
            continue
        if ShapeFilter(request).check(pool) is None and ProductFilter(request).check(pool) is None:
            nodes.update(pool.nodes)
    pinned = set(entry.request.get("nodes") or ())
    return nodes & pinned if pinned else nodes


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _when(at: datetime | None) -> str:
    return f" at {at:%Y-%m-%d %H:%M}Z" if at is not None else ""


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"


def _away(snapshot: Snapshot, nodes: set[str]) -> list[QueueHint]:
    hints = []
    for name in sorted(nodes):
        node = snapshot.nodes.get(name)
        if node is None:
            continue
        if node.status is not NodeStatus.READY:
            why = node.status.value.lower()
        elif not node.agent_live:
            why = "without a live agent"
        elif node.cooling_off is not None:
            why = "cooling off after failures"
        else:
            out = sum(
                1
                for s in node.slots
                if s.state is SlotState.QUARANTINED or s.health in (HealthState.DEGRADED, HealthState.FAILED)
            )
            if not out:
                continue
            hints.append(
                QueueHint(
                    kind="node_return", text=f"{_gpus(out)} of node {name} are quarantined or unhealthy: their return"
                )
            )
            continue
        hints.append(QueueHint(kind="node_return", text=f"node {name} ({_gpus(len(node.slots))}) is {why}: its return"))
    return hints


def hints_for(
    entry: QueueEntry,
    snapshot: Snapshot,
    holdings: list[Holding],
    reserved: list[Reserved],
    owners: dict[str, str],
    caller: Principal,
) -> list[QueueHint]:
    """What would let `entry` through, soonest first (at most MOST), or one `nothing_known`; none while it is
    being placed. `holdings` and `reserved`: its region's (store.reservations.window_facts); `owners`: allocation
    id -> tenant for those holdings."""
    if entry.node is not None:
        return []

    def named(allocation_id: str) -> str:
        return allocation_id if caller.may_see(owners.get(allocation_id, "")) else HIDDEN

    hints: list[QueueHint] = []
    if entry.code in QUOTA_CODES:
        own = sorted(
            (h for h in holdings if owners.get(h.allocation_id) == entry.tenant and h.until is not None),
            key=lambda h: h.until or 0.0,
        )
        for held in own[:MOST]:
            at = _at(held.until or 0.0)
            hints.append(
                QueueHint(
                    kind="quota",
                    text=f"{held.allocation_id} ({_gpus(held.gpus)} of {entry.tenant}'s quota) ends{_when(at)}",
                    at=at,
                )
            )
        return hints or [
            QueueHint(
                kind="nothing_known",
                text=f"nothing known: none of {entry.tenant}'s allocations in {entry.region} has an end",
            )
        ]

    nodes = candidate_nodes(snapshot, entry)
    here = [h for h in holdings if h.node in nodes]
    timed: list[QueueHint] = []
    for held in sorted((h for h in here if h.until is not None), key=lambda h: h.until or 0.0)[:MOST]:
        at = _at(held.until or 0.0)
        timed.append(
            QueueHint(
                kind="release",
                text=f"{named(held.allocation_id)} ({_gpus(held.gpus)} on {held.node}) ends its lease{_when(at)}",
                at=at,
            )
        )
    for window in sorted((r for r in reserved if r.node in nodes), key=lambda r: r.window.end)[:MOST]:
        at = _at(window.window.end)
        timed.append(
            QueueHint(
                kind="reservation_end",
                text=f"a reservation of {_gpus(window.gpus)} on {window.node} ends{_when(at)}",
                at=at,
            )
        )
    timed.sort(key=lambda hint: hint.at or datetime.max.replace(tzinfo=UTC))
    hints.extend(timed[:MOST])
    hints.extend(_borrowed(entry, snapshot, here, owners, caller))
    hints.extend(_away(snapshot, nodes))
    return hints[:MOST] or [
        QueueHint(
            kind="nothing_known",
            text="nothing known: no lease ends, no reservation ends and no node is away on the nodes it could use",
        )
    ]


def _borrowed(
    entry: QueueEntry, snapshot: Snapshot, here: list[Holding], owners: dict[str, str], caller: Principal
) -> list[QueueHint]:
    """GPUs on its candidate nodes held by tenants of its cohort tree beyond their quota, while its own tenant is
    within its quota: what reclaiming (its policy permitting) or those leases' ends would give back."""
    mine = snapshot.tenants.get(entry.tenant)
    if mine is None or mine.cohort is None or mine.active_gpus + entry.gpu_count > mine.gpu_quota:
        return []
    tree = root_of(mine.cohort, snapshot.cohorts)
    on_nodes: dict[str, int] = defaultdict(int)
    for held in here:
        on_nodes[owners.get(held.allocation_id, "")] += held.gpus
    hints = []
    for tenant, gpus in sorted(on_nodes.items()):
        view = snapshot.tenants.get(tenant)
        if tenant == entry.tenant or view is None or view.cohort is None:
            continue
        if root_of(view.cohort, snapshot.cohorts) != tree:
            continue
        over = min(gpus, view.active_gpus - view.gpu_quota)
        if over <= 0:
            continue
        who = tenant if caller.may_see(tenant) else "another tenant"
        if mine.preemption.reclaim_within_cohort is ReclaimWithinCohort.NEVER:
            how = f"{entry.tenant}'s policy does not reclaim: they come back as those leases end"
        else:
            how = (
                f"reclaimable under {entry.tenant}'s reclaimWithinCohort {mine.preemption.reclaim_within_cohort.value}"
            )
        hints.append(QueueHint(kind="reclaim", text=f"{who} borrows {_gpus(over)} there beyond its quota ({how})"))
    return hints
