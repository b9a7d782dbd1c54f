"""A Cohort's `fairSharing.preemptionStrategies` (Kueue's, in order, on a fair-sharing root) and its `quotaMode`
(Additive, Kueue's Cohort; Department, KAI-Scheduler's department): what loads, what the snapshot built from the
fleet file carries, and the problem an operator is shown, at its field, for each mistake."""

from __future__ import annotations

import pytest

from contracts.vocabulary import DEFAULT_FAIR_SHARING_STRATEGIES, CohortQuotaMode, FairSharingStrategy
from scheduler.from_fleet import snapshot_from_fleet
from tests.fleet.test_queue_settings import REGION, cohort, parse, problems, tenant


def test_a_root_lists_its_strategies_in_order_and_one_that_names_none_gets_kueues_pair() -> None:
    fleet = parse(
        REGION
        + cohort("org", "{fairSharing: {enabled: true, preemptionStrategies: [LessThanInitialShare]}}")
        + cohort("other", "{fairSharing: {enabled: true}}")
    )
    assert fleet.cohorts["org"].spec.fair_sharing.preemption_strategies == (
        FairSharingStrategy.LESS_THAN_INITIAL_SHARE,
    )
    cohorts = snapshot_from_fleet(fleet).cohorts
    assert cohorts["org"].preemption_strategies == (FairSharingStrategy.LESS_THAN_INITIAL_SHARE,)
    assert cohorts["other"].preemption_strategies == DEFAULT_FAIR_SHARING_STRATEGIES


def test_a_department_reaches_the_snapshot_and_a_cohort_that_says_nothing_is_additive() -> None:
    fleet = parse(
        REGION
        + cohort("org", "{gpuQuota: 4}")
        + cohort("vision", "{parentName: org, quotaMode: Department, gpuQuota: 8}")
        + tenant("{gpuQuota: 4, cohort: vision}")
    )
    cohorts = snapshot_from_fleet(fleet).cohorts
    assert cohorts["vision"].quota_mode is CohortQuotaMode.DEPARTMENT
    assert cohorts["org"].quota_mode is CohortQuotaMode.ADDITIVE


def test_a_department_with_per_product_quotas_alone_loads() -> None:
    fleet = parse(REGION + cohort("vision", "{quotaMode: Department, quotas: [{product: H100, nominal: 8}]}"))
    assert fleet.cohorts["vision"].spec.quota_mode is CohortQuotaMode.DEPARTMENT


@pytest.mark.parametrize(
    ("documents", "path", "message"),
    [
        (
            cohort("a", "{fairSharing: {preemptionStrategies: [LessThanInitialShare]}}"),
            "spec.fairSharing.preemptionStrategies",
            "preemptionStrategies choose how a fair-sharing tree preempts: set enabled: true on this root cohort "
            "with them",
        ),
        (
            cohort("a", "{fairSharing: {enabled: true, preemptionStrategies: []}}"),
            "spec.fairSharing.preemptionStrategies",
            "name at least one strategy, or leave preemptionStrategies unset for Kueue's default "
            "[LessThanOrEqualToFinalShare, LessThanInitialShare]",
        ),
        (
            cohort(
                "a",
                "{fairSharing: {enabled: true, preemptionStrategies: "
                "[LessThanInitialShare, LessThanOrEqualToFinalShare, LessThanInitialShare]}}",
            ),
            "spec.fairSharing.preemptionStrategies",
            "[LessThanInitialShare, LessThanOrEqualToFinalShare, LessThanInitialShare] is not a list Kueue accepts: "
            "one of [LessThanOrEqualToFinalShare]; [LessThanInitialShare]; [LessThanOrEqualToFinalShare, "
            "LessThanInitialShare] (a second strategy is always LessThanInitialShare, tried once per tenant on what "
            "the first left)",
        ),
        (
            cohort(
                "a",
                "{fairSharing: {enabled: true, preemptionStrategies: [LessThanInitialShare, LessThanOrEqualToFinalShare]}}",
            ),
            "spec.fairSharing.preemptionStrategies",
            "[LessThanInitialShare, LessThanOrEqualToFinalShare] is not a list Kueue accepts: "
            "one of [LessThanOrEqualToFinalShare]; [LessThanInitialShare]; [LessThanOrEqualToFinalShare, "
            "LessThanInitialShare] (a second strategy is always LessThanInitialShare, tried once per tenant on what "
            "the first left)",
        ),
        (
            cohort("a", "{fairSharing: {enabled: true, preemptionStrategies: [LessThanFinalShare]}}"),
            "spec.fairSharing.preemptionStrategies[0]",
            "Input should be 'LessThanOrEqualToFinalShare' or 'LessThanInitialShare'",
        ),
        (
            cohort("a", "{quotaMode: Department}"),
            "spec.quotaMode",
            "quotaMode Department bounds what its members use together by its own quota: set gpuQuota (or quotas)",
        ),
        (
            cohort("org", "{}")
            + cohort("a", "{parentName: org, quotaMode: Department, gpuQuota: 8, borrowingLimit: 2}"),
            "spec.quotaMode",
            "a Department's quota already caps what its subtree draws from its parent: drop borrowingLimit",
        ),
        (
            cohort("org", "{}")
            + cohort(
                "a",
                "{parentName: org, quotaMode: Department, quotas: [{product: H100, region: r1, nominal: 8, "
                "borrowingLimit: 2}]}",
            ),
            "spec.quotaMode",
            "a Department's quota already caps what its subtree draws from its parent: drop borrowingLimit (its "
            "quotas for H100 in r1)",
        ),
        (
            cohort("a", "{quotaMode: Project, gpuQuota: 8}"),
            "spec.quotaMode",
            "Input should be 'Additive' or 'Department'",
        ),
    ],
)
def test_a_mistaken_strategy_list_or_quota_mode_is_refused_at_its_field(
    documents: str, path: str, message: str
) -> None:
    found = problems(REGION + documents)
    assert ("Cohort/a", path, message) in found, found
