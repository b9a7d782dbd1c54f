"""The region scheduler: tenant admission (quota), then one region for the request.

It decides from tenant policy, region status, jurisdiction, which products each region offers at what price, and
an aggregate of how many allocations of this size each region's matching pools could take; never from PCI
addresses, NUMA or host state (docs/seeds.md, "Four layers, each deciding only what it knows"). A region the user
names is validated, never second-guessed; otherwise the best allowed region wins: one with room first, available
before degraded, then the lower price, then the most room, then the name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from contracts.explanation import Level, LevelExplanation, Refusal
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from fleet.region import RegionStatus
from scheduler.explanation import Tally
from scheduler.placement.capacity import AllocationCount
from scheduler.placement.pinning import pinned_refusal, regions_of_pins
from scheduler.placement.plugins import Filter, first_failure
from scheduler.placement.pools import judge_pool_classes
from scheduler.quota import accounts as quota
from scheduler.reasons import clause
from scheduler.snapshot import Snapshot
from scheduler.views import RegionView, TenantView


class RegionDecision(BaseModel):
    model_config = ConfigDict(frozen=True)

    region: str | None
    refusal: Refusal | None
    levels: list[LevelExplanation]


@dataclass(frozen=True)
class AllowedForTenant:
    tenant: TenantView | None

    def check(self, region: RegionView) -> Reason | None:
        if self.tenant is None or self.tenant.allowed_regions is None:
            return None
        return None if region.name in self.tenant.allowed_regions else Reason.REGION_NOT_ALLOWED


@dataclass(frozen=True)
class Residency:
    """The request's and the tenant's required jurisdictions must both hold."""

    required: frozenset[str]

    def check(self, region: RegionView) -> Reason | None:
        if not self.required:
            return None
        return None if self.required == {region.jurisdiction} else Reason.JURISDICTION_MISMATCH


@dataclass(frozen=True)
class HoldsPinnedNode:
    """A request that pins nodes can only be served in a region holding one of them (`scheduler/placement/pinning.py`)."""

    regions: frozenset[str]

    def check(self, region: RegionView) -> Reason | None:
        return None if region.name in self.regions else Reason.NO_PINNED_NODE


@dataclass(frozen=True)
class RegionAvailable:
    def check(self, region: RegionView) -> Reason | None:
        return Reason.REGION_UNAVAILABLE if region.status is RegionStatus.UNAVAILABLE else None


@dataclass(frozen=True)
class ProductOffered:
    offer: dict[str, RegionOffer]

    def check(self, region: RegionView) -> Reason | None:
        return None if self.offer[region.name].products else Reason.PRODUCT_NOT_OFFERED


@dataclass(frozen=True)
class PoolsMatch:
    """The region has a pool that the cluster scheduler would accept (cluster labels, readiness, DRA selectors):
    a region whose only pools of the product fail the request's selectors must not win and then refuse."""

    offer: dict[str, RegionOffer]

    def check(self, region: RegionView) -> Reason | None:
        offer = self.offer[region.name]
        if offer.pools:
            return None
        if offer.pool_reasons - {Reason.SHAPE_MISMATCH, Reason.PRODUCT_MISMATCH} == {Reason.LEASE_TOO_LONG}:
            # the pools of the product and shape asked for fail on the length alone: say so
            return Reason.LEASE_TOO_LONG
        return Reason.NO_POOL_MATCHES


@dataclass(frozen=True)
class RegionOffer:
    """What one region offers this request: matching products, the cheapest price among them, and room."""

    products: tuple[str, ...]
    pools: int  # pools the cluster scheduler would accept for this request
    price: float | None
    room: int  # allocations of the requested size its matching pools could take now
    pool_reasons: frozenset[Reason] = frozenset()  # why the cluster scheduler would drop the others

    @classmethod
    def of(
        cls, snapshot: Snapshot, region: RegionView, request: PlacementRequest, count: AllocationCount
    ) -> RegionOffer:
        # Per pool class (pools the cluster scheduler judges alike), not per pool: see `scheduler.snapshot`.
        pools = [
            pool_class.pool
            for pool_class in snapshot.pool_classes(region.name)
            if (pool := pool_class.pool).shape == request.shape
            and pool.gpu_product
            and request.wants_product(pool.gpu_product)
        ]
        products = tuple(sorted({pool.gpu_product for pool in pools if pool.gpu_product}))
        prices = [price for price in (region.price(product) for product in products) if price is not None]
        matching, level = judge_pool_classes(snapshot, request, region.name)
        room = sum(count.of_class(snapshot, pool_class) for pool_class in matching)
        return cls(
            products=products,
            pools=sum(len(pool_class.pools) for pool_class in matching),
            price=min(prices, default=None),
            room=room,
            pool_reasons=frozenset(level.dropped),
        )

    def describe(self, region: RegionView) -> str:
        offered = ", ".join(self.products) or "no matching product"
        price = f"{self.price:.2f}/GPU-h" if self.price is not None else "unpriced"
        return (
            f"{region.status}, jurisdiction {region.jurisdiction or 'none'}, {offered} at {price}, room for {self.room}"
        )


def _admit_tenant(
    snapshot: Snapshot, request: PlacementRequest, detail: bool
) -> tuple[TenantView | None, Refusal | None, LevelExplanation]:
    tally = Tally(Level.TENANT, "tenants", "are admitted", request.gpu_count, detail)
    name = request.tenant or ""
    tenant = snapshot.tenants.get(name)
    if tenant is None:
        tally.record(Reason.UNKNOWN_TENANT, [name], lambda: "not in the inventory")
        return None, Refusal(code=Reason.UNKNOWN_TENANT, message=f"tenant {name!r} is not known"), tally.explanation()
    decision = _tenant_quota(snapshot, tenant, request)
    sums = f"{tenant.active_gpus} active + {tenant.in_flight_gpus} in flight + {request.gpu_count} requested"
    within = f"{sums} <= quota {tenant.gpu_quota}"
    if decision.borrowed:
        within = f"{sums}, {decision.borrowed} borrowed from cohort {tenant.cohort}"
    tally.record(
        None if decision.fits else Reason.QUOTA_EXCEEDED, [name], lambda: within if decision.fits else decision.message
    )
    if decision.fits:
        return tenant, None, tally.explanation()
    return tenant, Refusal(code=Reason.QUOTA_EXCEEDED, message=decision.message), tally.explanation()


def _tenant_quota(snapshot: Snapshot, tenant: TenantView, request: PlacementRequest) -> quota.QuotaDecision:
    """The tenant's total quota, then, when it has per-product quotas, whether one of those the request could be
    placed on (a product it wants, a region it may use) has room: which pools may take it is the pool level's
    (`scheduler.placement.pools.QuotaFilter`). An early answer on the snapshot's usage, for the placement and the
    API's 409; the claim's check under lock (`store.claims`) decides with the same arithmetic."""
    tenants = snapshot.tenants.values()
    decision = quota.decide(
        tenant,
        request.gpu_count,
        tenants,
        request.within_nominal,
        snapshot.cohorts,
        quota.snapshot_tree(snapshot, tenant),
    )
    if not decision.fits or tenant.quotas is None:
        return decision
    places = _quota_places(snapshot, tenant, request)
    if not places:
        named = ", ".join(q.describe() for q in tenant.quotas) or "none"
        return quota.QuotaDecision(
            False, 0, f"tenant {tenant.name} has no quota for {request.describe()} (its quotas: {named})"
        )
    refusals = []
    for product, region in places:
        flavor = quota.decide_flavor(
            tenant, product, region, request.gpu_count, tenants, request.within_nominal, snapshot.cohorts
        )
        if flavor.fits:
            return decision
        refusals.append(flavor.message)
    return quota.QuotaDecision(False, 0, "; ".join(dict.fromkeys(refusals)))


def _quota_places(snapshot: Snapshot, tenant: TenantView, request: PlacementRequest) -> list[tuple[str, str]]:
    """(product, region) of the pools the request could be placed on, as far as its product, shape, region and the
    tenant's regions say, that one of the tenant's per-product quotas covers."""
    regions = [request.region] if request.region else list(snapshot.regions)
    return sorted(
        {
            (pool.gpu_product, pool.region)
            for region in regions
            if tenant.allowed_regions is None or region in tenant.allowed_regions
            for pool in snapshot.pools_in(region)
            if pool.shape == request.shape
            and pool.gpu_product
            and request.wants_product(pool.gpu_product)
            and quota.flavor_of(tenant, pool.gpu_product, pool.region) is not None
        }
    )


def quota_refusal(snapshot: Snapshot, request: PlacementRequest) -> Refusal | None:
    """The `quota_exceeded` refusal region selection would give the request now, or None: for admission to refuse
    early with the same code and message (api/feasibility.py), from the same arithmetic."""
    _, refusal, _ = _admit_tenant(snapshot, request, detail=False)
    return refusal if refusal is not None and refusal.code is Reason.QUOTA_EXCEEDED else None


def waiting_region(snapshot: Snapshot, request: PlacementRequest) -> str | None:
    """Where a request refused by its tenant's quota waits for it: the region it would be given were the
    quota no object (the tenant's other policy still holds); None when it could never fit in the quota, even with
    everything an idle cohort could lend (`quota.ceiling`), so waiting cannot help."""
    tenant = snapshot.tenants.get(request.tenant or "")
    if tenant is None or request.gpu_count > quota.ceiling(
        tenant, snapshot.tenants.values(), request.wants_product, snapshot.cohorts
    ):
        return None
    unbounded = dataclasses.replace(
        tenant,
        gpu_quota=request.gpu_count,
        active_gpus=0,
        in_flight_gpus=0,
        cohort=None,
        held=(),
        quotas=quota.unbounded_flavors(tenant, request.gpu_count, snapshot.tenants.values(), snapshot.cohorts),
    )
    others = [view for name, view in snapshot.tenants.items() if name != tenant.name]
    return select_region(snapshot.with_tenants([*others, unbounded]), request).region


def select_region(snapshot: Snapshot, request: PlacementRequest, *, detail: bool = False) -> RegionDecision:
    levels: list[LevelExplanation] = []
    tenant: TenantView | None = None
    if request.tenant is not None:
        tenant, refusal, level = _admit_tenant(snapshot, request, detail)
        levels.append(level)
        if refusal is not None:
            return RegionDecision(region=None, refusal=refusal, levels=levels)

    tally = Tally(Level.REGION, "regions", f"can serve {request.describe()}", request.gpu_count, detail)
    if request.region is not None and request.region not in snapshot.regions:
        tally.record(Reason.UNKNOWN_REGION, [request.region], lambda: "not in the inventory")
        levels.append(tally.explanation())
        message = f"region {request.region} is not a known region"
        return RegionDecision(region=None, refusal=Refusal(code=Reason.UNKNOWN_REGION, message=message), levels=levels)

    count = AllocationCount(request.shape, request.gpu_count, request.numa_policy)
    offers = {name: RegionOffer.of(snapshot, region, request, count) for name, region in snapshot.regions.items()}
    required = {j for j in (request.required_jurisdiction, tenant and tenant.required_jurisdiction) if j}
    plugins: list[Filter[RegionView]] = [
        AllowedForTenant(tenant),
        Residency(frozenset(required)),
        RegionAvailable(),
        ProductOffered(offers),
    ]
    pinned = regions_of_pins(snapshot, request.nodes) if request.nodes else None
    if pinned is not None:
        # Pinned nodes decide the region; the cluster level then says, node by node, why a pinned one cannot serve.
        plugins.insert(0, HoldsPinnedNode(frozenset(pinned)))
    elif request.region is None:
        # Choosing: skip regions whose pools the cluster level would all refuse. A named region goes on to the
        # pool level, whose explanation says pool by pool which selector or label failed.
        plugins.append(PoolsMatch(offers))
    considered = [snapshot.regions[request.region]] if request.region else list(snapshot.regions.values())
    eligible: list[RegionView] = []
    dropped: Reason | None = None
    for region in considered:
        reason = first_failure(region, plugins)
        if reason is None:
            eligible.append(region)
        dropped = dropped or reason
        tally.record(reason, [region.name], offers[region.name].describe, region)
    level = tally.explanation()
    levels.append(level)

    if not eligible:
        if pinned is not None and not pinned.intersection(r.name for r in considered):
            refusal = pinned_refusal(snapshot, request, request.region)
        elif request.region is not None and dropped is not None:
            refusal = Refusal(code=dropped, message=f"region {request.region} {clause(dropped, request.gpu_count)}")
        else:
            refusal = Refusal(code=Reason.NO_REGION, message=level.summary)
        return RegionDecision(region=None, refusal=refusal, levels=levels)

    def rank(region: RegionView) -> tuple[bool, bool, float, int, str]:
        offer = offers[region.name]
        price = offer.price if offer.price is not None else math.inf
        return (offer.room == 0, region.status is RegionStatus.DEGRADED, price, -offer.room, region.name)

    return RegionDecision(region=min(eligible, key=rank).name, refusal=None, levels=levels)
