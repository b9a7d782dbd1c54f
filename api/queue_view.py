"""The queues as the API shows them: `GET /v1/queues` and an allocation's `queue` place.

    queue_entries (store.queue)  +  the inventory's snapshot (capacity per product, tenants' weights)
      + who holds what (store.queue.holdings)
      -> scheduler.admission.admit.ordered: admission order per region, the admission pass's (Kueue's classic order, or
         its fair-sharing tournament where a cohort tree shares fairly)
      -> each entry's position, share (and decayed usage where a tree remembers usage), wait, and why it is not
         placed yet (what the last admission pass recorded)
      -> what would let it through (api/queue_hints.py: leases' ends, borrowed GPUs, reservations' ends, nodes away)

Positions count every tenant's requests of the region, whoever asks. A tenant token is shown its own requests only,
and never another tenant's allocation id: a pass's reason may name the head it waits behind, and that id is
replaced by "a request of another tenant". Shares are those `ordered` computes over the tenant's whole cohort tree.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from api import queue_hints
from api.errors import ApiError
from api.request_checks import fleet_for, unknown_name
from contracts.http import QueueItem, QueueList, QueuePlace, RegionQueue, TenantStanding
from contracts.placement import PlacementRequest
from scheduler.admission.admit import Standing, ordered
from scheduler.admission.shares import usage_by_product
from scheduler.placement.pools import ProductFilter, ShapeFilter
from scheduler.quota import accounts as quota
from scheduler.quota import fair_sharing
from scheduler.quota.usage_decay import half_lives
from scheduler.snapshot import Snapshot
from scheduler.views import PoolView
from store import allocations, queue, reservations, usage
from store.db import AsyncSession
from store.inventory import InventoryCache
from store.queue import QueueEntry
from store.tokens import Principal

HIDDEN = "a request of another tenant"

# For readers that are not given the app's cache (allocation_view.detail without one): kept per process, as the
# app's own is, so it reads the inventory whole only when the fleet changes.
_inventory = InventoryCache()


def status_line(entry: QueueEntry) -> str:
    """Why it is not placed yet, in one line."""
    if entry.node is not None:
        return f"being placed on {entry.node}"
    if entry.reserved_node is not None:
        held = f"head of the queue: node {entry.reserved_node} is reserved for it"
        return f"{held}; {entry.reason}" if entry.reason else held
    return entry.reason or "waiting for the next admission pass"


def _redacted(text: str | None, hidden: frozenset[str]) -> str | None:
    if text is None:
        return None
    for allocation_id in hidden:
        text = text.replace(allocation_id, HIDDEN)
    return text


async def _others_victims(
    session: AsyncSession, entries: list[QueueEntry], shown_to: str | frozenset[str] | None
) -> frozenset[str]:
    """The allocations these entries preempt that are not of the tenant(s) `shown_to` (none for an operator or
    admin): a reason names each victim with its rule, and a tenant never reads another tenant's allocation id."""
    victims = {v for e in entries for v in e.victims or ()}
    if shown_to is None or not victims:
        return frozenset()
    owners = await allocations.tenants_of(session, victims)
    mine = frozenset({shown_to}) if isinstance(shown_to, str) else shown_to
    return frozenset(victims - {allocation for allocation, tenant in owners.items() if tenant in mine})


def _place(entry: QueueEntry, position: int, now: datetime, hidden: frozenset[str]) -> dict[str, Any]:
    return {
        "position": position,
        "region": entry.region,
        "priority": entry.priority,
        "priority_class": entry.priority_class,
        "waited_seconds": round(max(0.0, (now - entry.enqueued_at).total_seconds()), 1),
        "enqueued_at": entry.enqueued_at,
        "deadline_at": entry.deadline_at,
        "reason": _redacted(entry.reason, hidden),
        "code": entry.code,
        "node": entry.node,
        "reserved_node": entry.reserved_node,
        "status": _redacted(status_line(entry), hidden) or "",
    }


async def _snapshot(session: AsyncSession, inventory: InventoryCache | None) -> Snapshot:
    """The inventory's snapshot: pools, capacity and tenants' weights are all the order needs, and where a cohort
    tree orders by usage that remembers, its tenants' decayed usage now (read, not carried forward: the admission
    pass does that)."""
    snapshot = (await (inventory or _inventory).inventory(session)).snapshot
    return await usage.with_decayed_usage(session, snapshot, datetime.now(UTC), fold=False)


def _holding(snapshot: Snapshot, holdings: list[tuple[str, str, int]]) -> Snapshot:
    """The snapshot with each tenant's GPUs held now on its view (whether a request would borrow, and each share,
    depend on them)."""
    held: dict[str, int] = {}
    for tenant, _, gpus in holdings:
        held[tenant] = held.get(tenant, 0) + gpus
    return snapshot.with_tenants(
        dataclasses.replace(view, active_gpus=held.get(name, 0), in_flight_gpus=0)
        for name, view in snapshot.tenants.items()
    )


def _in_order(
    entries: list[QueueEntry], snapshot: Snapshot, holdings: list[tuple[str, str, int]]
) -> dict[str, list[tuple[QueueEntry, Standing]]]:
    """region -> its entries in admission order, with their tenant's share and decayed usage. What each tenant
    holds goes on its view: whether a request would borrow, and each share, depend on it."""
    usage = usage_by_product(snapshot, holdings)
    snapshot = _holding(snapshot, holdings)
    by_id = {entry.allocation_id: entry for entry in entries}
    regions: dict[str, list[QueueEntry]] = {}
    for entry in entries:
        regions.setdefault(entry.region, []).append(entry)
    return {
        region: [
            (by_id[request.allocation_id], standing)
            for request, standing in ordered((e.queued() for e in queued), snapshot, usage)
        ]
        for region, queued in sorted(regions.items())
    }


def _pool(snapshot: Snapshot, caller: Principal, key: str, region: str | None) -> PoolView:
    """The pool `<cluster>/<pool>` the caller may use: 422 `unknown_pool` otherwise, or when it is not in `region`."""
    pools = {pool.key: pool for pool in fleet_for(snapshot, caller).pools}
    found = pools.get(key)
    if found is None:
        raise unknown_name("query.pool", "pool", key, sorted(pools), caller)
    if region is not None and found.region != region:
        detail = {"field": "query.pool", "value": key, "type": "pool_region"}
        raise ApiError(422, "invalid_request", f"pool {key} is in region {found.region}, not {region}", [detail])
    return found


def _for_pool(pool: PoolView, entry: QueueEntry) -> bool:
    """Whether the pool could serve the waiting request (its shape and product), or holds a node set aside or
    reserved for it."""
    if entry.node in pool.nodes or entry.reserved_node in pool.nodes:
        return True
    request = PlacementRequest.model_validate(entry.request)
    return ShapeFilter(request).check(pool) is None and ProductFilter(request).check(pool) is None


async def queues(
    session: AsyncSession,
    inventory: InventoryCache | None,
    caller: Principal,
    region: str | None = None,
    pool: str | None = None,
) -> QueueList:
    """Every region's queue (or `region`'s) as `caller` may see it. A region that neither exists in the fleet the
    caller may use nor holds a request of the caller is 422 `unknown_region`, as it is on a create. With `pool`
    (`<cluster>/<pool>`), its region's queue, with only the requests that pool could serve, at their places in the
    whole queue: one queue per region, pools of a region share its placement lock and its admission order."""
    snapshot = await _snapshot(session, inventory)
    serving = _pool(snapshot, caller, pool, region) if pool is not None else None
    if serving is not None:
        region = serving.region
    entries = await queue.entries(session, region=region)
    own = [e for e in entries if caller.may_see(e.tenant)]
    visible_regions = set(fleet_for(snapshot, caller).regions)
    if region is not None and region not in visible_regions and not any(e.region == region for e in own):
        raise unknown_name("query.region", "region", region, sorted(visible_regions), caller)
    shown_regions = {e.region for e in own} | ({e.region for e in entries} & visible_regions)
    if region is not None:
        shown_regions = {region}
    holdings = await queue.holdings(session)
    in_order = _in_order(entries, snapshot, holdings)
    held_snapshot = _holding(snapshot, holdings)
    now = datetime.now(UTC)
    result: list[RegionQueue] = []
    for name in sorted(shown_regions):
        line = in_order.get(name, [])
        hidden = frozenset(e.allocation_id for e, _ in line if not caller.may_see(e.tenant))
        hidden |= await _others_victims(session, [e for e, _ in line], caller.visible)
        shown = [e for e, _ in line if e.allocation_id not in hidden and e.node is None]
        running, reserved = await reservations.window_facts(session, name) if shown else ([], [])
        owners = await allocations.tenants_of(session, [h.allocation_id for h in running]) if running else {}
        items = [
            QueueItem(
                **_place(entry, position, now, hidden),
                allocation_id=entry.allocation_id,
                tenant=entry.tenant,
                gpu_count=entry.gpu_count,
                gpu_product=entry.request.get("gpu_product"),
                shape=str(entry.request.get("shape") or "gpu_slice"),
                share=round(standing.share, 6) if standing.share is not None else None,
                decayed_gpu_hours=round(standing.usage / 3600, 6) if standing.usage is not None else None,
                unblock=queue_hints.hints_for(entry, held_snapshot, running, reserved, owners, caller),
            )
            for position, (entry, standing) in enumerate(line, start=1)
            if entry.allocation_id not in hidden and (serving is None or _for_pool(serving, entry))
        ]
        view = snapshot.regions.get(name)
        strategy = view.queueing_strategy.value if view is not None else None
        result.append(RegionQueue(region=name, strategy=strategy, length=len(line), entries=items))
    return QueueList(regions=result)


async def place_of(
    session: AsyncSession, allocation_id: str, shown_to: str | None, inventory: InventoryCache | None = None
) -> QueuePlace | None:
    """The allocation's place in its region's queue, or None when it is not waiting in one. `shown_to`: the tenant
    reading it (other tenants' ids are left out of the reason), None for an admin."""
    entry = await queue.entry(session, allocation_id)
    if entry is None:
        return None
    snapshot = await _snapshot(session, inventory)
    line = _in_order(await queue.entries(session, region=entry.region), snapshot, await queue.holdings(session))
    ranked = line.get(entry.region, [])
    position = next((n for n, (e, _) in enumerate(ranked, start=1) if e.allocation_id == allocation_id), None)
    if position is None:  # it left the queue between the two reads
        return None
    hidden = frozenset(e.allocation_id for e, _ in ranked if shown_to is not None and e.tenant != shown_to)
    hidden |= await _others_victims(session, [entry], shown_to)
    return QueuePlace(**_place(entry, position, datetime.now(UTC), hidden))


async def standings(
    session: AsyncSession, inventory: InventoryCache | None, tenants: frozenset[str] | None
) -> list[TenantStanding]:
    """Each tenant's standing in fair sharing now (`tenants`: those the caller may see; None: every one): its
    weight, its share and its decayed usage, as the admission pass and `GET /v1/queues` compute them."""
    snapshot = _holding(await _snapshot(session, inventory), await queue.holdings(session))
    lives = half_lives(snapshot.tenants, snapshot.cohorts)
    result = []
    for name, view in sorted(snapshot.tenants.items()):
        if tenants is not None and name not in tenants:
            continue
        shown = fair_sharing.tenant_share(quota.snapshot_tree(snapshot, view), view).shown
        result.append(
            TenantStanding(
                tenant=name,
                cohort=view.cohort,
                weight=view.weight,
                fair_sharing=fair_sharing.shares_fairly(view, snapshot.cohorts),
                share=round(shown, 6) if shown is not None else None,
                decayed_gpu_hours=round(view.decayed_usage / 3600, 6) if view.decayed_usage is not None else None,
                usage_half_life_hours=round(lives[name] / 3600, 3) if name in lives else None,
            )
        )
    return result
