"""Quotas that borrow and lend (issue 24): Kueue's cohort rules, over a tenant's GPUs and over its GPUs of one
product (and region).

Every quota is an account: a nominal figure, what the tenant holds against it, and the limits of its cohort:

    used(m)      GPUs tenant m holds against the account: active, in flight, releasing with claims
                 (store.snapshot.holds_gpus)
    borrowed(m)  max(0, used(m) - nominal(m))                     what m uses beyond its own quota
    lendable(m)  min(lendingLimit(m), max(0, nominal(m) - used(m)))  what m's unused quota offers the others

    a request of g GPUs of tenant t fits an account when used(t) + g <= nominal(t), or, t being in a cohort,
      used(t) + g - nominal(t) <= borrowingLimit(t)                and
      sum of borrowed over the cohort, t's with the request   <=   sum of lendable over the cohort

A tenant has one account for all its GPUs (`gpuQuota`, `borrowingLimit`, `lendingLimit`), and, when its fleet file
gives `quotas`, one per GPU product (in one region, or in every region together: Kueue's nominal quota per
resource flavor). A placement on a node must fit both: the total, and the product's account for the node's
product and region; a product (or region) none of its `quotas` names is not the tenant's to use. Within a cohort,
an account lends only to the same account of the other members (the same product and region).

An allocation placed beyond a nominal quota runs on borrowed quota and is marked so (`allocations.borrowed_gpus`),
for preemption to reclaim later. Unset limits are unlimited; a tenant in no cohort has its nominal quotas as hard
caps, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scheduler.views import FlavorQuotaView, TenantView

UNLIMITED = 1 << 62


@dataclass(frozen=True)
class QuotaDecision:
    fits: bool
    borrowed: int  # GPUs of the request's tenant beyond its nominal quota once the request holds its GPUs
    message: str  # why it does not fit ("" when it does)


@dataclass(frozen=True)
class Account:
    """One quota of one tenant, with what it holds against it."""

    tenant: str
    cohort: str | None
    what: str  # "GPU quota", "H100 quota in eu-1": for messages
    nominal: int
    used: int
    used_text: str  # how `used` is made up, for messages
    borrowing_limit: int | None
    lending_limit: int | None

    @property
    def borrowed(self) -> int:
        return max(0, self.used - self.nominal)

    @property
    def lendable(self) -> int:
        limit = self.lending_limit if self.lending_limit is not None else UNLIMITED
        return min(limit, max(0, self.nominal - self.used))

    @property
    def lendable_when_idle(self) -> int:
        limit = self.lending_limit if self.lending_limit is not None else UNLIMITED
        return min(limit, self.nominal)


def used(tenant: TenantView) -> int:
    return tenant.active_gpus + tenant.in_flight_gpus


def total_account(tenant: TenantView) -> Account:
    return Account(
        tenant=tenant.name,
        cohort=tenant.cohort,
        what="GPU quota",
        nominal=tenant.gpu_quota,
        used=used(tenant),
        used_text=f"{tenant.active_gpus} active + {tenant.in_flight_gpus} in flight",
        borrowing_limit=tenant.borrowing_limit,
        lending_limit=tenant.lending_limit,
    )


def flavor_of(tenant: TenantView, product: str, region: str) -> FlavorQuotaView | None:
    """The tenant's quota a placement on `product` in `region` is charged to (None: none of its quotas names it)."""
    return next((q for q in tenant.quotas or () if q.covers(product, region)), None)


def flavor_account(tenant: TenantView, flavor: FlavorQuotaView) -> Account:
    held = sum(gpus for product, region, gpus in tenant.held if flavor.covers(product, region))
    return Account(
        tenant=tenant.name,
        cohort=tenant.cohort,
        what=f"{flavor.describe()} quota",
        nominal=flavor.nominal,
        used=held,
        used_text=f"{held} held",
        borrowing_limit=flavor.borrowing_limit,
        lending_limit=flavor.lending_limit,
    )


def decide_account(account: Account, gpus: int, cohort: Iterable[Account]) -> QuotaDecision:
    """Whether `gpus` more fit `account`, borrowing from the same account of its cohort's other members."""
    after = account.used + gpus
    if after <= account.nominal:
        return QuotaDecision(True, 0, "")
    sums = f"{account.used_text} + {gpus} requested"
    own = f"tenant {account.tenant} would exceed its {account.what}: {sums} > quota {account.nominal}"
    if account.cohort is None:
        return QuotaDecision(False, 0, own)
    over = after - account.nominal
    limit = account.borrowing_limit if account.borrowing_limit is not None else UNLIMITED
    if over > limit:
        return QuotaDecision(False, 0, f"{own}, and {over} beyond it is more than its borrowingLimit {limit}")
    members = [m for m in cohort if m.tenant != account.tenant]
    lendable = sum(m.lendable for m in members)
    borrowed_by_others = sum(m.borrowed for m in members)
    if borrowed_by_others + over > lendable:
        left = max(0, lendable - borrowed_by_others - account.borrowed)
        return QuotaDecision(
            False,
            0,
            f"{own}, and cohort {account.cohort} has {left} GPUs left to lend ({over - account.borrowed} needed)",
        )
    return QuotaDecision(True, over, "")


def _members(tenant: TenantView, tenants: Iterable[TenantView]) -> list[TenantView]:
    if tenant.cohort is None:
        return []
    return [m for m in tenants if m.cohort == tenant.cohort and m.name != tenant.name]


def _flavor_cohort(tenant: TenantView, flavor: FlavorQuotaView, tenants: Iterable[TenantView]) -> list[Account]:
    """The same quota (product and region) of the tenant's cohort's other members: the ones that can lend it."""
    key = (flavor.product.casefold(), flavor.region)
    return [
        flavor_account(member, same)
        for member in _members(tenant, tenants)
        if (same := next((q for q in member.quotas or () if (q.product.casefold(), q.region) == key), None)) is not None
    ]


def decide(tenant: TenantView, gpus: int, tenants: Iterable[TenantView]) -> QuotaDecision:
    """Whether `gpus` more fit in `tenant`'s total quota, borrowing from its cohort (`tenants`: every tenant known,
    usage applied) when it has one."""
    cohort = [total_account(m) for m in _members(tenant, tenants)]
    return decide_account(total_account(tenant), gpus, cohort)


def decide_flavor(
    tenant: TenantView, product: str, region: str, gpus: int, tenants: Iterable[TenantView]
) -> QuotaDecision:
    """Whether `gpus` more of `product` in `region` fit the tenant's quota for them (always, for a tenant without
    per-product `quotas`), borrowing from the same quota of its cohort's members."""
    if tenant.quotas is None:
        return QuotaDecision(True, 0, "")
    flavor = flavor_of(tenant, product, region)
    if flavor is None:
        named = ", ".join(q.describe() for q in tenant.quotas) or "none"
        return QuotaDecision(
            False, 0, f"tenant {tenant.name} has no quota for {product} in {region} (its quotas: {named})"
        )
    cohort = _flavor_cohort(tenant, flavor, tenants)
    return decide_account(flavor_account(tenant, flavor), gpus, cohort)


def decide_placement(
    tenant: TenantView, product: str | None, region: str, gpus: int, tenants: Iterable[TenantView]
) -> QuotaDecision:
    """Both checks for a placement on a node of `product` in `region`: the total, then the product's quota. The
    GPUs it borrows are the larger of the two."""
    tenants = list(tenants)
    total = decide(tenant, gpus, tenants)
    if not total.fits or product is None:
        return total
    flavor = decide_flavor(tenant, product, region, gpus, tenants)
    if not flavor.fits:
        return flavor
    return QuotaDecision(True, max(total.borrowed, flavor.borrowed), "")


def _ceiling(account: Account, cohort: Iterable[Account]) -> int:
    if account.cohort is None:
        return account.nominal
    lendable = sum(m.lendable_when_idle for m in cohort if m.tenant != account.tenant)
    limit = account.borrowing_limit if account.borrowing_limit is not None else UNLIMITED
    return account.nominal + min(limit, lendable)


def flavor_ceiling(tenant: TenantView, flavor: FlavorQuotaView, tenants: Iterable[TenantView]) -> int:
    cohort = _flavor_cohort(tenant, flavor, tenants)
    return _ceiling(flavor_account(tenant, flavor), cohort)


def ceiling(tenant: TenantView, tenants: Iterable[TenantView], wants: Callable[[str], bool] | None = None) -> int:
    """The most GPUs one request of `tenant` could ever hold: its nominal quota, plus what its cohort could lend it
    were every other member idle (capped by its borrowing limit); with per-product quotas, no more than the largest
    of those for a product the request `wants`. A request larger than this can never be admitted."""
    tenants = list(tenants)
    total = _ceiling(total_account(tenant), [total_account(m) for m in _members(tenant, tenants)])
    if tenant.quotas is None:
        return total
    flavors = [q for q in tenant.quotas if wants is None or wants(q.product)]
    return min(total, max((flavor_ceiling(tenant, q, tenants) for q in flavors), default=0))


def unbounded_flavors(
    tenant: TenantView, gpus: int, tenants: Iterable[TenantView]
) -> tuple[FlavorQuotaView, ...] | None:
    """The tenant's per-product quotas as they would be were nothing held anywhere: those that could ever take
    `gpus`, each with room for it. Where a request refused by its quota would wait (`scheduler.region`)."""
    if tenant.quotas is None:
        return None
    tenants = list(tenants)
    return tuple(
        FlavorQuotaView(product=q.product, region=q.region, nominal=gpus)
        for q in tenant.quotas
        if flavor_ceiling(tenant, q, tenants) >= gpus
    )
