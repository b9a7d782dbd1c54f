"""A cohort's `quotaMode` (scheduler/quota/cohorts.py through scheduler/quota/accounts.py): `Additive` is Kueue's
Cohort, whose quota adds GPUs to its subtree; `Department` is KAI-Scheduler's department, whose quota bounds what its
members hold together: they borrow from each other, and from its parent, only up to it, and a non-preemptible
request must fit it as nominal quota."""

from __future__ import annotations

from contracts.vocabulary import CohortQuotaMode
from scheduler.quota.accounts import ceiling, decide, decide_placement
from scheduler.views import CohortView, FlavorQuotaView, TenantView

ADDITIVE, DEPARTMENT = CohortQuotaMode.ADDITIVE, CohortQuotaMode.DEPARTMENT


def cohorts(
    mode: CohortQuotaMode = DEPARTMENT, quota: int = 8, quotas: tuple[FlavorQuotaView, ...] = ()
) -> dict[str, CohortView]:
    """org (a root with no quota) above the department `vision`, beside the tenant `other` with 10 GPUs idle."""
    return {
        "org": CohortView(name="org"),
        "vision": CohortView(name="vision", parent="org", gpu_quota=quota, quotas=quotas, quota_mode=mode),
    }


def fleet(v1: int = 0, v2: int = 0, quotas: tuple[int, int] = (4, 4)) -> list[TenantView]:
    return [
        TenantView(name="v1", gpu_quota=quotas[0], active_gpus=v1, cohort="vision"),
        TenantView(name="v2", gpu_quota=quotas[1], active_gpus=v2, cohort="vision"),
        TenantView(name="other", gpu_quota=10, cohort="org"),
    ]


def test_a_departments_members_together_never_hold_more_than_its_quota_however_much_its_parent_has() -> None:
    tenants = fleet(v1=4, v2=3)
    v2 = tenants[1]
    assert decide(v2, 1, tenants, cohorts=cohorts()).fits
    refused = decide(v2, 2, tenants, cohorts=cohorts())
    assert not refused.fits
    assert refused.message == (
        "tenant v2 would exceed its GPU quota (3 active + 0 in flight + 2 requested > quota 4), but department "
        "vision would exceed its quota: 7 held by its members + 2 requested > quota 8; its members get GPUs back as "
        "they release them, or by preemption (reclaimWithinCohort)"
    )
    idle = fleet()
    assert ceiling(idle[0], idle, cohorts=cohorts()) == 8  # not its 4 + v2's 4 + other's 10


def test_members_of_a_department_borrow_from_each_other_within_it() -> None:
    tenants = fleet(v2=4)  # v1 holds nothing: its 4 are v2's to borrow
    v2 = tenants[1]
    admitted = decide(v2, 4, tenants, cohorts=cohorts())
    assert admitted.fits and admitted.borrowed == 4
    assert not decide(v2, 5, tenants, cohorts=cohorts()).fits  # other's 10 idle GPUs are beyond the department


def test_a_department_above_smaller_quotas_draws_the_rest_from_its_parent_up_to_its_quota() -> None:
    """Its quota adds no GPUs: with members' quotas of 2 and 2 it reaches 8 only by borrowing 4 from its parent,
    as a borrowing limit that caps its total use would let it."""
    tenants = fleet(quotas=(2, 2))
    assert ceiling(tenants[0], tenants, cohorts=cohorts()) == 8
    other_busy = [*tenants[:2], TenantView(name="other", gpu_quota=10, active_gpus=10, cohort="org")]
    assert decide(other_busy[0], 4, other_busy, cohorts=cohorts()).fits  # its own 2 and v2's 2
    assert not decide(other_busy[0], 5, other_busy, cohorts=cohorts()).fits  # the parent has nothing left to lend


def test_the_same_quota_on_an_additive_cohort_adds_gpus_to_its_subtree_as_before() -> None:
    tenants = fleet(v1=4, v2=3)
    v2 = tenants[1]
    assert decide(v2, 2, tenants, cohorts=cohorts(ADDITIVE)).fits  # borrowed through org: 8 of vision's own, 10 idle
    idle = fleet()
    assert ceiling(idle[0], idle, cohorts=cohorts(ADDITIVE)) == 4 + 4 + 8 + 10
    assert ceiling(idle[0], idle, cohorts=cohorts(DEPARTMENT)) == 8


def test_a_non_preemptible_request_within_its_tenants_quota_is_refused_by_a_full_department() -> None:
    """KAI checks a non-preemptible workload against its queue's quota and each parent queue's: v1 asks for 3 of
    its own 4, but the department's 6 are already 4 held by v2 (members' quotas may add up to more than it)."""
    tenants = fleet(v2=4)
    v1 = tenants[0]
    department = cohorts(quota=6)
    refused = decide(v1, 3, tenants, within_nominal=True, cohorts=department)
    assert not refused.fits
    assert refused.message == (
        "tenant v1 is within its GPU quota (0 active + 0 in flight + 3 requested <= quota 4), but department vision "
        "would exceed its quota: 4 held by its members + 3 requested > quota 6, and a non-preemptible PriorityClass "
        "is admitted only within nominal quota, its department's included"
    )
    assert decide(v1, 2, tenants, within_nominal=True, cohorts=department).fits


def test_a_departments_quota_for_a_product_bounds_its_members_gpus_of_that_product() -> None:
    h100 = (FlavorQuotaView(product="H100", region=None, nominal=4),)
    department = cohorts(quotas=(FlavorQuotaView(product="H100", region=None, nominal=4),))
    tenants = [
        TenantView(name="v1", gpu_quota=4, cohort="vision", quotas=h100),
        TenantView(name="v2", gpu_quota=4, active_gpus=3, cohort="vision", quotas=h100, held=(("H100", "r1", 3),)),
        TenantView(name="other", gpu_quota=10, cohort="org", quotas=h100),
    ]
    v1 = tenants[0]
    assert decide_placement(v1, "H100", "r1", 1, tenants, cohorts=department).fits
    refused = decide_placement(v1, "H100", "r1", 2, tenants, cohorts=department)
    assert not refused.fits
    assert refused.message.startswith(
        "tenant v1 is within its H100 quota (0 held + 2 requested <= quota 4), but department vision would exceed its "
        "quota: 3 held by its members + 2 requested > quota 4"
    )
