"""Quotas that borrow and lend: Kueue's cohort rules, over a tenant's GPUs and over its GPUs of one
product (and region).

Every quota is an account: a nominal figure, what the tenant holds against it, and the limits of its cohort. As in
Kueue, quota is a cap whatever the hardware: a cohort's members together never use more than they own, and a
member whose quota is lent out gets it back by preemption (`reclaimWithinCohort`), not from free hardware beyond
the cohort's sum.

    used(m)        GPUs tenant m holds against the account: active, in flight, releasing with claims
                   (store.snapshot.holds_gpus)
    guaranteed(m)  nominal(m) - lendingLimit(m) (0 without a lending limit)   what only m may use
    in_cohort(m)   nominal(m) - guaranteed(m)                                 what m puts in the cohort's pool
    drawn(m)       max(0, used(m) - guaranteed(m))                            what m draws from that pool
    borrowed(m)    max(0, used(m) - nominal(m))                               what m uses beyond its own quota

    available(t) = max(0, guaranteed(t) - used(t))                            t's own, which nobody else draws
                 + min(sum of in_cohort - sum of drawn, over the cohort,       the pool, t's own part included
                       in_cohort(t) - drawn(t) + borrowingLimit(t))            t's reach into it, when limited
    a request of g GPUs of tenant t fits when g <= available(t); without a cohort, when used(t) + g <= nominal(t)

This is Kueue's `available` over a resource node and its cohort (pkg/cache, resource_node.go), for one level; a
cohort with a parent, or a quota of its own (a Cohort object), makes a tree, and `scheduler.quota.cohorts` computes the
same numbers at every level of it (the one-level formula above is its case of a root cohort with no quota). A
cohort in `Department` mode (KAI-Scheduler's department) bounds what its members hold together: a request that
would take it beyond its quota is refused naming it, and for a non-preemptible request that quota is nominal quota
too, as KAI checks a non-preemptible workload against its queue's quota and each parent queue's.

A tenant has one account for all its GPUs (`gpuQuota`, `borrowingLimit`, `lendingLimit`), and, when its fleet file
gives `quotas`, one per GPU product (in one region, or in every region together: Kueue's nominal quota per
resource flavor). A placement on a node must fit both: the total, and the product's account for the node's
product and region; a product (or region) none of its `quotas` names is not the tenant's to use. Within a cohort,
an account lends only to the same account of the other members (the same product and region).

An allocation placed beyond a nominal quota runs on borrowed quota and records its own part of the borrowing
(`allocations.borrowed_gpus`: of a 1-GPU allocation, at most 1); preemption asks whether its tenant borrows now. Unset limits are unlimited; a tenant in no cohort has its nominal quotas as hard
caps, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.quota.cohorts import (
    CohortTree,
    FullDepartment,
    Leaf,
    Limits,
    flavor_limits,
    root_of,
    total_limits,
    tree_members,
)
from scheduler.views import CohortView, FlavorQuotaView, TenantView

if TYPE_CHECKING:  # the snapshot asks nothing of quota: it keeps what `snapshot_tree` builds, per tree
    from scheduler.snapshot import Snapshot


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
    def guaranteed(self) -> int:
        """What only this tenant may use: the part of its quota above its lending limit."""
        return max(0, self.nominal - self.lending_limit) if self.lending_limit is not None else 0

    @property
    def in_cohort(self) -> int:
        """What its quota puts in the cohort's pool (all of it, or its lending limit)."""
        return self.nominal - self.guaranteed

    @property
    def drawn(self) -> int:
        """What it draws from the cohort's pool: its use beyond its guaranteed part."""
        return max(0, self.used - self.guaranteed)


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


Cohorts = Mapping[str, CohortView]
NO_COHORTS: Cohorts = {}


def _leaf(account: Account) -> Leaf:
    return Leaf(
        account.tenant, account.cohort, account.nominal, account.used, account.borrowing_limit, account.lending_limit
    )


def tree_of(
    account: Account,
    members: Iterable[Account],
    cohorts: Cohorts,
    limits_of: Callable[[CohortView], Limits] = total_limits,
) -> CohortTree:
    """The cohort tree of `account` (`members`: the same account of the other tenants of its tree)."""
    return CohortTree([_leaf(account), *(_leaf(m) for m in members if m.tenant != account.tenant)], cohorts, limits_of)


def available(account: Account, tree: CohortTree) -> int:
    """How many more GPUs `account` may hold: its own unused guaranteed part, plus what its cohort tree has left,
    as far as its borrowing limit (and each cohort's on the way up) reaches."""
    return max(0, tree.available(("tenant", account.tenant)))


def decide_account(account: Account, gpus: int, tree: CohortTree, within_nominal: bool = False) -> QuotaDecision:
    """Whether `gpus` more fit `account`, borrowing through its cohort tree (`within_nominal`: a non-preemptible
    request, which may not borrow)."""
    after = account.used + gpus
    borrowed = max(0, after - account.nominal)
    if within_nominal and borrowed:
        return QuotaDecision(
            False,
            0,
            (
                f"tenant {account.tenant} would exceed its {account.what}: {account.used_text} + {gpus} requested > "
                f"quota {account.nominal}, and a non-preemptible PriorityClass is admitted only within its nominal quota, "
                "never on borrowed GPUs"
            ),
        )
    full = tree.full_department(("tenant", account.tenant), gpus)
    if full is not None:
        return QuotaDecision(False, 0, _department_words(account, gpus, full, within_nominal))
    room = available(account, tree)
    if gpus <= room:
        return QuotaDecision(True, borrowed, "")
    sums = f"{account.used_text} + {gpus} requested"
    if account.cohort is None:
        own = f"tenant {account.tenant} would exceed its {account.what}: {sums} > quota {account.nominal}"
        return QuotaDecision(False, 0, own)
    cohort = _cohort_words(account, tree)
    if after <= account.nominal:
        lent = sum(max(0, tree.used[n] - tree.limits[n].nominal) for n in tree.used if n[1] != account.tenant)
        return QuotaDecision(
            False,
            0,
            (
                f"tenant {account.tenant} is within its {account.what} ({sums} <= quota {account.nominal}), but {cohort} "
                f"has lent it out: {lent} GPUs borrowed by other members; they come back as those are released, or by "
                "preemption (reclaimWithinCohort)"
            ),
        )
    own = f"tenant {account.tenant} would exceed its {account.what}: {sums} > quota {account.nominal}"
    limit = account.borrowing_limit
    if limit is not None and borrowed > limit:
        return QuotaDecision(False, 0, f"{own}, and {borrowed} beyond it is more than its borrowingLimit {limit}")
    left = max(0, room - max(0, account.nominal - account.used))
    needed = borrowed - account.borrowed
    return QuotaDecision(False, 0, f"{own}, and {cohort} has {left} GPUs left to lend ({needed} needed)")


def _department_words(account: Account, gpus: int, full: FullDepartment, within_nominal: bool) -> str:
    """Why a department refuses: its members together would hold more than its quota. A non-preemptible request
    is told that nominal quota binds at the department too (KAI-Scheduler checks a non-preemptible workload against
    the quota of its queue and of every queue above it): the department's quota is nominal quota its members share,
    and what they hold beyond their own quotas is borrowed from each other."""
    sums = f"{account.used_text} + {gpus} requested"
    if account.used + gpus <= account.nominal:
        own = f"tenant {account.tenant} is within its {account.what} ({sums} <= quota {account.nominal})"
    else:
        own = f"tenant {account.tenant} would exceed its {account.what} ({sums} > quota {account.nominal})"
    words = (
        f"{own}, but department {full.cohort} would exceed its quota: {full.total} held by its members + {gpus} "
        f"requested > quota {full.bound}"
    )
    if within_nominal:
        return (
            f"{words}, and a non-preemptible PriorityClass is admitted only within nominal quota, its department's "
            "included"
        )
    return f"{words}; its members get GPUs back as they release them, or by preemption (reclaimWithinCohort)"


def _cohort_words(account: Account, tree: CohortTree) -> str:
    """ "cohort research", or "cohort team-a (in org)" for a cohort with a parent."""
    path = [name for _, name in tree.ancestors(("tenant", account.tenant))]
    return f"cohort {path[0]}" + (f" (in {' > '.join(reversed(path[1:]))})" if len(path) > 1 else "")


def _members(tenant: TenantView, tenants: Iterable[TenantView], cohorts: Cohorts) -> list[TenantView]:
    return tree_members(tenant, tenants, cohorts) if tenant.cohort is not None else []


def _flavor_members(
    tenant: TenantView, flavor: FlavorQuotaView, tenants: Iterable[TenantView], cohorts: Cohorts
) -> list[Account]:
    """The same quota (product and region) of the other tenants of the tenant's cohort tree: the ones that can lend
    it."""
    key = (flavor.product.casefold(), flavor.region)
    return [
        flavor_account(member, same)
        for member in _members(tenant, tenants, cohorts)
        if (same := next((q for q in member.quotas or () if (q.product.casefold(), q.region) == key), None)) is not None
    ]


def total_tree(tenant: TenantView, tenants: Iterable[TenantView], cohorts: Cohorts = NO_COHORTS) -> CohortTree:
    """The tenant's cohort tree over its GPUs in total."""
    members = [total_account(m) for m in _members(tenant, tenants, cohorts)]
    return tree_of(total_account(tenant), members, cohorts)


def snapshot_tree(snapshot: Snapshot, tenant: TenantView) -> CohortTree:
    """The tenant's cohort tree over GPUs in total for the snapshot's tenants and their usage, built once per tree
    and snapshot: an admission pass asks it for every request it judges."""
    if tenant.cohort is None:
        return total_tree(tenant, (), snapshot.cohorts)
    root = root_of(tenant.cohort, snapshot.cohorts) or tenant.cohort
    tree = snapshot.per_tree(root, lambda: total_tree(tenant, snapshot.tenants.values(), snapshot.cohorts))
    if ("tenant", tenant.name) not in tree.parent:  # a tenant the snapshot does not list: its own tree, unkept
        return total_tree(tenant, [*snapshot.tenants.values(), tenant], snapshot.cohorts)
    return tree


def flavor_tree(
    tenant: TenantView, flavor: FlavorQuotaView, tenants: Iterable[TenantView], cohorts: Cohorts = NO_COHORTS
) -> CohortTree:
    members = _flavor_members(tenant, flavor, tenants, cohorts)
    return tree_of(flavor_account(tenant, flavor), members, cohorts, flavor_limits(flavor.product, flavor.region))


def decide(
    tenant: TenantView,
    gpus: int,
    tenants: Iterable[TenantView],
    within_nominal: bool = False,
    cohorts: Cohorts = NO_COHORTS,
    tree: CohortTree | None = None,
) -> QuotaDecision:
    """Whether `gpus` more fit in `tenant`'s total quota, borrowing through its cohort tree (`tenants`: every tenant
    known, usage applied; `cohorts`: the fleet's Cohort objects; `tree`: that tree, when the caller has it built)
    when it has one and the request may borrow."""
    tree = tree if tree is not None else total_tree(tenant, tenants, cohorts)
    return decide_account(total_account(tenant), gpus, tree, within_nominal)


def decide_flavor(
    tenant: TenantView,
    product: str,
    region: str,
    gpus: int,
    tenants: Iterable[TenantView],
    within_nominal: bool = False,
    cohorts: Cohorts = NO_COHORTS,
) -> QuotaDecision:
    """Whether `gpus` more of `product` in `region` fit the tenant's quota for them (always, for a tenant without
    per-product `quotas`), borrowing from the same quota of its cohort tree."""
    if tenant.quotas is None:
        return QuotaDecision(True, 0, "")
    flavor = flavor_of(tenant, product, region)
    if flavor is None:
        named = ", ".join(q.describe() for q in tenant.quotas) or "none"
        return QuotaDecision(
            False, 0, f"tenant {tenant.name} has no quota for {product} in {region} (its quotas: {named})"
        )
    tree = flavor_tree(tenant, flavor, tenants, cohorts)
    return decide_account(flavor_account(tenant, flavor), gpus, tree, within_nominal)


def decide_placement(
    tenant: TenantView,
    product: str | None,
    region: str,
    gpus: int,
    tenants: Iterable[TenantView],
    within_nominal: bool = False,
    cohorts: Cohorts = NO_COHORTS,
) -> QuotaDecision:
    """Both checks for a placement on a node of `product` in `region`: the total, then the product's quota. The
    GPUs it borrows are the larger of the two."""
    tenants = list(tenants)
    total = decide(tenant, gpus, tenants, within_nominal, cohorts)
    if not total.fits or product is None:
        return total
    flavor = decide_flavor(tenant, product, region, gpus, tenants, within_nominal, cohorts)
    if not flavor.fits:
        return flavor
    return QuotaDecision(True, max(total.borrowed, flavor.borrowed), "")


def _idle(account: Account) -> Account:
    return dataclasses.replace(account, used=0)


def flavor_ceiling(
    tenant: TenantView, flavor: FlavorQuotaView, tenants: Iterable[TenantView], cohorts: Cohorts = NO_COHORTS
) -> int:
    members = [_idle(m) for m in _flavor_members(tenant, flavor, tenants, cohorts)]
    limits = flavor_limits(flavor.product, flavor.region)
    return available(
        _idle(flavor_account(tenant, flavor)), tree_of(_idle(flavor_account(tenant, flavor)), members, cohorts, limits)
    )


def ceiling(
    tenant: TenantView,
    tenants: Iterable[TenantView],
    wants: Callable[[str], bool] | None = None,
    cohorts: Cohorts = NO_COHORTS,
) -> int:
    """The most GPUs one request of `tenant` could ever hold: what it could use were every tenant of its cohort
    tree idle (its nominal quota, plus what the tree could lend it within every borrowing limit on the way); with
    per-product quotas, no more than the largest of those for a product the request `wants`. A request larger than
    this can never be admitted."""
    tenants = list(tenants)
    own = _idle(total_account(tenant))
    total = available(own, tree_of(own, [_idle(total_account(m)) for m in _members(tenant, tenants, cohorts)], cohorts))
    if tenant.quotas is None:
        return total
    flavors = [q for q in tenant.quotas if wants is None or wants(q.product)]
    return min(total, max((flavor_ceiling(tenant, q, tenants, cohorts) for q in flavors), default=0))


def unbounded_flavors(
    tenant: TenantView, gpus: int, tenants: Iterable[TenantView], cohorts: Cohorts = NO_COHORTS
) -> tuple[FlavorQuotaView, ...] | None:
    """The tenant's per-product quotas as they would be were nothing held anywhere: those that could ever take
    `gpus`, each with room for it. Where a request refused by its quota would wait (`scheduler.placement.region`)."""
    if tenant.quotas is None:
        return None
    tenants = list(tenants)
    return tuple(
        FlavorQuotaView(product=q.product, region=q.region, nominal=gpus)
        for q in tenant.quotas
        if flavor_ceiling(tenant, q, tenants, cohorts) >= gpus
    )
