"""Quotas that borrow and lend (issue 24): Kueue's cohort rules over a tenant's GPUs.

A tenant's `gpuQuota` is its nominal quota. Tenants of one `cohort` lend each other what they do not use, so a
tenant may hold more than its nominal quota while the cohort has unused quota to cover it:

    used(m)      GPUs tenant m holds: active, in flight, releasing with claims (store.snapshot.holds_gpus)
    borrowed(m)  max(0, used(m) - nominal(m))                     what m uses beyond its own quota
    lendable(m)  min(lendingLimit(m), max(0, nominal(m) - used(m)))  what m's unused quota offers the others

    a request of g GPUs of tenant t fits when used(t) + g <= nominal(t), or, t being in a cohort,
      used(t) + g - nominal(t) <= borrowingLimit(t)                and
      sum of borrowed over the cohort, t's with the request   <=   sum of lendable over the cohort

An allocation placed beyond its tenant's nominal quota runs on borrowed quota and is marked so
(`allocations.borrowed_gpus`), for preemption to reclaim later. Unset limits are unlimited; a tenant in no cohort
has its nominal quota as a hard cap, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.views import TenantView

UNLIMITED = 1 << 62


@dataclass(frozen=True)
class QuotaDecision:
    fits: bool
    borrowed: int  # GPUs of the request's tenant beyond its nominal quota once the request holds its GPUs
    message: str  # why it does not fit ("" when it does)


def used(tenant: TenantView) -> int:
    return tenant.active_gpus + tenant.in_flight_gpus


def _lendable(member: TenantView) -> int:
    limit = member.lending_limit if member.lending_limit is not None else UNLIMITED
    return min(limit, max(0, member.gpu_quota - used(member)))


def decide(tenant: TenantView, gpus: int, tenants: Iterable[TenantView]) -> QuotaDecision:
    """Whether `gpus` more fit in `tenant`'s quota, borrowing from its cohort (`tenants`: every tenant known, usage
    applied) when it has one."""
    after = used(tenant) + gpus
    sums = f"{tenant.active_gpus} active + {tenant.in_flight_gpus} in flight + {gpus} requested"
    if after <= tenant.gpu_quota:
        return QuotaDecision(True, 0, "")
    own = f"tenant {tenant.name} would exceed its GPU quota: {sums} > quota {tenant.gpu_quota}"
    if tenant.cohort is None:
        return QuotaDecision(False, 0, own)
    over = after - tenant.gpu_quota
    limit = tenant.borrowing_limit if tenant.borrowing_limit is not None else UNLIMITED
    if over > limit:
        return QuotaDecision(False, 0, f"{own}, and {over} beyond it is more than its borrowingLimit {limit}")
    members = [m for m in tenants if m.cohort == tenant.cohort and m.name != tenant.name]
    lendable = sum(_lendable(m) for m in members)
    borrowed_by_others = sum(max(0, used(m) - m.gpu_quota) for m in members)
    if borrowed_by_others + over > lendable:
        already = max(0, used(tenant) - tenant.gpu_quota)  # what it borrows now
        left = max(0, lendable - borrowed_by_others - already)
        return QuotaDecision(
            False, 0, f"{own}, and cohort {tenant.cohort} has {left} GPUs left to lend ({over - already} needed)"
        )
    return QuotaDecision(True, over, "")


def ceiling(tenant: TenantView, tenants: Iterable[TenantView]) -> int:
    """The most GPUs `tenant` could ever hold at once: its nominal quota, plus what its cohort could lend it were
    every other member idle (capped by its borrowing limit). A request larger than this can never be admitted."""
    if tenant.cohort is None:
        return tenant.gpu_quota
    members = [m for m in tenants if m.cohort == tenant.cohort and m.name != tenant.name]
    lendable = sum(min(m.lending_limit if m.lending_limit is not None else UNLIMITED, m.gpu_quota) for m in members)
    limit = tenant.borrowing_limit if tenant.borrowing_limit is not None else UNLIMITED
    return tenant.gpu_quota + min(limit, lendable)
