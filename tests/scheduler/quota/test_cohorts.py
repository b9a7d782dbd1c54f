"""Hierarchical cohorts (scheduler/quota/cohorts.py through scheduler/quota/accounts.py): Kueue's resource-node arithmetic over a
tree of Cohort objects (pkg/cache resource_node.go: subtree quota, usage beyond each child's guaranteed part,
`available` up the parent chain with each level's borrowing limit), cases drawn from Kueue's hierarchical cohort
docs and KEP-79."""

from __future__ import annotations

from scheduler.quota.accounts import ceiling, decide
from scheduler.quota.cohorts import path_to_root, root_of
from scheduler.views import CohortView, TenantView


def tenant(name: str, quota: int, cohort: str | None, used: int = 0, **limits: int) -> TenantView:
    return TenantView(name=name, gpu_quota=quota, active_gpus=used, cohort=cohort, **limits)


def tree(**cohorts: dict[str, object]) -> dict[str, CohortView]:
    return {name: CohortView(name=name, **spec) for name, spec in cohorts.items()}  # type: ignore[arg-type]


ORG = tree(org={}, a={"parent": "org"}, b={"parent": "org"})


def fleet(a1: int = 0, a2: int = 0, b1: int = 0) -> list[TenantView]:
    return [tenant("a1", 4, "a", a1), tenant("a2", 4, "a", a2), tenant("b1", 4, "b", b1)]


def test_a_tenant_borrows_from_its_own_cohort_and_from_the_cohorts_beside_it() -> None:
    """Two levels: a1 may use what a2 (same cohort) and b1 (the sibling cohort, through the root) leave unused."""
    tenants = fleet()
    assert ceiling(tenants[0], tenants, cohorts=ORG) == 12
    assert decide(tenants[0], 12, tenants, cohorts=ORG).fits


def test_what_a_sibling_subtree_borrows_is_not_lent_twice() -> None:
    tenants = fleet(b1=6)  # b1 borrows 2 beyond its 4: they come from cohort a's subtree, through org
    a1 = tenants[0]
    assert decide(a1, 6, tenants, cohorts=ORG).fits
    refused = decide(a1, 7, tenants, cohorts=ORG)
    assert not refused.fits
    assert refused.message == (
        "tenant a1 would exceed its GPU quota: 0 active + 0 in flight + 7 requested > quota 4, and cohort a (in org) "
        "has 2 GPUs left to lend (3 needed)"
    )


def test_a_cohorts_borrowing_limit_caps_what_its_whole_subtree_draws_from_its_parent() -> None:
    """Kueue: a Cohort's borrowingLimit bounds its subtree's usage beyond the quota it stores in its parent."""
    cohorts = tree(org={}, a={"parent": "org", "borrowing_limit": 1}, b={"parent": "org"})
    assert ceiling(fleet()[0], fleet(), cohorts=cohorts) == 9  # a's 8, and 1 of b's
    tenants = fleet(a2=4)
    assert decide(tenants[0], 5, tenants, cohorts=cohorts).fits
    assert not decide(tenants[0], 6, tenants, cohorts=cohorts).fits


def test_a_cohorts_lending_limit_keeps_its_subtrees_quota_inside_it() -> None:
    """Kueue: guaranteed = subtree quota - lendingLimit stays with the subtree (lendingLimit 0: it lends nothing)."""
    cohorts = tree(org={}, a={"parent": "org", "lending_limit": 0}, b={"parent": "org"})
    tenants = fleet()
    assert ceiling(tenants[2], tenants, cohorts=cohorts) == 4  # b1 gets nothing of a's 8
    assert ceiling(tenants[0], tenants, cohorts=cohorts) == 12  # a's subtree still borrows b's 4


def test_a_cohorts_own_quota_is_shared_by_its_subtree_and_quota_stays_a_cap() -> None:
    """A Cohort's own nominal quota (Kueue's Cohort resourceGroups) is usable by everyone below it; the tree never
    uses more than its quotas together, whatever the hardware."""
    cohorts = tree(org={"gpu_quota": 4}, a={"parent": "org"}, b={"parent": "org"})
    tenants = [*fleet(a1=4, a2=4, b1=4), tenant("z", 0, "org")]
    z = tenants[-1]
    assert decide(z, 4, tenants, cohorts=cohorts).fits and not decide(z, 5, tenants, cohorts=cohorts).fits


def test_a_lender_in_another_subtree_gets_its_quota_back_only_by_preemption() -> None:
    tenants = [tenant("a1", 4, "a"), tenant("a2", 0, "a"), tenant("b1", 4, "b", used=8)]  # b1 borrows a1's 4
    refused = decide(tenants[0], 1, tenants, cohorts=ORG)
    assert not refused.fits
    assert refused.message.startswith(
        "tenant a1 is within its GPU quota (0 active + 0 in flight + 1 requested <= quota 4), but cohort a (in org) has "
        "lent it out: 4 GPUs borrowed by other members"
    )


def test_a_flat_fleet_decides_as_before_and_a_tenant_in_no_cohort_is_capped() -> None:
    flat = [tenant("x", 4, "flat"), tenant("y", 4, "flat", used=2)]
    assert decide(flat[0], 6, flat, cohorts=ORG).fits and not decide(flat[0], 7, flat, cohorts=ORG).fits
    alone = tenant("solo", 3, None)
    assert ceiling(alone, [alone, *fleet()], cohorts=ORG) == 3


def test_paths_end_at_the_root_and_a_cycle_ends_where_it_closes() -> None:
    assert path_to_root("a", ORG) == ("a", "org") and root_of("nameless", ORG) == "nameless"
    looped = tree(p={"parent": "q"}, q={"parent": "p"})
    assert path_to_root("p", looped) == ("p", "q")
    tenants = [tenant("t", 2, "p"), tenant("u", 2, "q")]
    # Refused by validation (tests/fleet); were one to reach the scheduler, the arithmetic still ends, each climb
    # seeing a tree of its own that lends nothing across the loop.
    assert ceiling(tenants[0], tenants, cohorts=looped) == 2
