"""Quotas that borrow and lend within a cohort (scheduler/quota/accounts.py): Kueue's rules over a tenant's GPUs."""

from __future__ import annotations

from scheduler.quota.accounts import ceiling, decide
from scheduler.views import TenantView


def tenant(name: str, quota: int, used: int = 0, cohort: str | None = "research", **limits: int) -> TenantView:
    return TenantView(name=name, gpu_quota=quota, active_gpus=used, cohort=cohort, **limits)


def test_within_its_own_quota_nothing_is_borrowed() -> None:
    a = tenant("a", 4, used=2)
    assert decide(a, 2, [a]) == decide(a, 2, [a, tenant("b", 4)])
    assert decide(a, 2, [a]).fits and decide(a, 2, [a]).borrowed == 0


def test_without_a_cohort_the_quota_is_a_hard_cap() -> None:
    a = tenant("a", 4, used=2, cohort=None)
    lender = tenant("b", 100, cohort=None)
    refused = decide(a, 3, [a, lender])
    assert not refused.fits
    assert refused.message == "tenant a would exceed its GPU quota: 2 active + 0 in flight + 3 requested > quota 4"


def test_a_member_borrows_what_the_rest_of_its_cohort_does_not_use() -> None:
    a, b = tenant("a", 2), tenant("b", 4, used=1)
    granted = decide(a, 5, [a, b])  # 3 beyond its quota; b leaves 3 unused
    assert granted.fits and granted.borrowed == 3
    refused = decide(a, 6, [a, b])
    assert not refused.fits
    assert refused.message.endswith("and cohort research has 3 GPUs left to lend (4 needed)")


def test_what_others_already_borrowed_is_not_lent_twice() -> None:
    a, b, c = tenant("a", 2), tenant("b", 2, used=4), tenant("c", 4)  # b borrows 2 of c's 4
    assert decide(a, 4, [a, b, c]).fits  # the other 2 of c's
    assert not decide(a, 5, [a, b, c]).fits


def test_borrowing_and_lending_limits() -> None:
    a, b = tenant("a", 2, borrowing_limit=1), tenant("b", 8)
    assert decide(a, 3, [a, b]).fits and not decide(a, 4, [a, b]).fits
    assert decide(a, 4, [a, b]).message.endswith("and 2 beyond it is more than its borrowingLimit 1")
    a, b = tenant("a", 2), tenant("b", 8, lending_limit=3)
    assert decide(a, 5, [a, b]).fits and not decide(a, 6, [a, b]).fits


def test_another_cohorts_unused_quota_is_never_lent() -> None:
    a, stranger = tenant("a", 2), tenant("z", 100, cohort="elsewhere")
    assert not decide(a, 3, [a, stranger]).fits


def test_the_ceiling_is_the_quota_plus_what_an_idle_cohort_could_lend() -> None:
    a, b, c = tenant("a", 2, borrowing_limit=10), tenant("b", 4, used=4), tenant("c", 8, lending_limit=3)
    assert ceiling(a, [a, b, c]) == 2 + 4 + 3  # b's quota counts though b uses it now
    assert ceiling(tenant("a", 2, borrowing_limit=1), [a, b, c]) == 3
    assert ceiling(tenant("solo", 5, cohort=None), [a, b, c]) == 5


def test_a_quota_lent_out_is_not_taken_from_free_hardware() -> None:
    """Kueue: a cohort's usage never exceeds what its members own, whatever the hardware (ClusterQueue nominal
    quotas are caps; `available` in pkg/cache's resource nodes). A lender within its nominal quota waits for its
    GPUs, or reclaims them by preemption; it does not take GPUs beyond the cohort's sum."""
    lender, borrower = tenant("lender", 4), tenant("borrower", 4, used=8)  # borrows all of the lender's 4
    refused = decide(lender, 1, [lender, borrower])
    assert not refused.fits
    assert refused.message == (
        "tenant lender is within its GPU quota (0 active + 0 in flight + 1 requested <= quota 4), but cohort research "
        "has lent it out: 4 GPUs borrowed by other members; they come back as those are released, or by preemption "
        "(reclaimWithinCohort)"
    )
    partly = tenant("borrower", 4, used=6)  # borrows 2: the lender's other 2 are its own again
    assert decide(lender, 2, [lender, partly]).fits and not decide(lender, 3, [lender, partly]).fits


def test_a_lending_limit_keeps_the_rest_of_the_quota_for_its_owner() -> None:
    """Kueue's lendingLimit: nominal - lendingLimit is guaranteed to the ClusterQueue, whatever the others do."""
    lender, borrower = tenant("lender", 4, lending_limit=1), tenant("borrower", 4, used=5)  # borrows the 1 lendable
    assert decide(lender, 3, [lender, borrower]).fits  # its guaranteed 3
    assert not decide(lender, 4, [lender, borrower]).fits  # the fourth is lent out
    assert not decide(borrower, 1, [lender, borrower]).fits  # and nothing more can be lent


def test_borrowed_counts_only_what_is_beyond_the_nominal_quota() -> None:
    a, b = tenant("a", 3, used=3), tenant("b", 4)
    assert decide(a, 1, [a, b]).borrowed == 1  # the fourth GPU
    assert (
        decide(tenant("a", 3, used=4), 1, [a, b]).borrowed == 2
    )  # the tenant's excess after: the fifth's own part is 1


def test_a_non_preemptible_request_is_admitted_only_within_its_nominal_quota() -> None:
    """KAI-Scheduler admits non-preemptible workloads only within their queue's deserved quota, never on borrowed
    (over-quota) resources: borrowed GPUs may be reclaimed, and a non-preemptible allocation could not give them back."""
    a, b = tenant("a", 2, used=1), tenant("b", 8)
    assert decide(a, 1, [a, b], within_nominal=True).fits
    refused = decide(a, 2, [a, b], within_nominal=True)
    assert not refused.fits and refused.message.endswith(
        "and a non-preemptible PriorityClass is admitted only within its nominal quota, never on borrowed GPUs"
    )
    assert decide(a, 2, [a, b]).fits  # any other class borrows
