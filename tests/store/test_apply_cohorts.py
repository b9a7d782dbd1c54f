"""`berth apply` writes a Cohort's fair-sharing preemption strategies and its quota mode to PostgreSQL, and the
scheduler's snapshot read back from the database carries them: the strategies in the order the fleet file lists
them, Kueue's default pair where it names none, Additive where it says nothing about its quota."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from contracts.vocabulary import DEFAULT_FAIR_SHARING_STRATEGIES, CohortQuotaMode, FairSharingStrategy
from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.snapshot import load_snapshot

FLEET = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: r1}
spec: {status: available}
---
apiVersion: berth.dev/v1alpha1
kind: Cohort
metadata: {name: org}
spec: {fairSharing: {enabled: true, preemptionStrategies: [LessThanOrEqualToFinalShare]}}
---
apiVersion: berth.dev/v1alpha1
kind: Cohort
metadata: {name: vision}
spec: {parentName: org, quotaMode: Department, gpuQuota: 8}
---
apiVersion: berth.dev/v1alpha1
kind: Cohort
metadata: {name: plain}
spec: {gpuQuota: 2}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: acme}
spec: {gpuQuota: 4, cohort: vision}
"""


async def _apply(sessions, fleet: str = FLEET) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("fleet.yaml", fleet)]))


async def test_a_cohorts_strategies_and_quota_mode_reach_the_snapshot_read_from_the_database(sessions) -> None:
    await _apply(sessions)
    async with sessions() as session:
        cohorts = (await load_snapshot(session)).cohorts

    assert cohorts["org"].preemption_strategies == (FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,)
    assert cohorts["org"].quota_mode is CohortQuotaMode.ADDITIVE
    assert cohorts["vision"].quota_mode is CohortQuotaMode.DEPARTMENT
    assert cohorts["vision"].gpu_quota == 8
    assert cohorts["plain"].preemption_strategies == DEFAULT_FAIR_SHARING_STRATEGIES


async def test_changing_the_strategies_updates_the_cohort_and_the_same_file_again_changes_nothing(sessions) -> None:
    await _apply(sessions)
    edited = FLEET.replace("[LessThanOrEqualToFinalShare]", "[LessThanInitialShare]")
    async with sessions.begin() as session:
        result = await apply_fleet(session, parse_fleet([("fleet.yaml", edited)]))
    assert [(c.kind, c.name, c.action) for c in result.changes] == [("Cohort", "org", "updated")]
    async with sessions() as session:
        cohorts = (await load_snapshot(session)).cohorts
    assert cohorts["org"].preemption_strategies == (FairSharingStrategy.LESS_THAN_INITIAL_SHARE,)

    async with sessions.begin() as session:
        again = await apply_fleet(session, parse_fleet([("fleet.yaml", edited)]))
    assert again.changes == []


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        ("UPDATE cohorts SET quota_mode = 'Project' WHERE name = 'vision'", "ck_cohorts_quota_mode"),
        ("UPDATE cohorts SET preemption_strategies = '[]' WHERE name = 'org'", "ck_cohorts_preemption_strategies"),
        (
            """UPDATE cohorts SET preemption_strategies = '["LessThanFinalShare"]' WHERE name = 'org'""",
            "ck_cohorts_preemption_strategies",
        ),
        (
            """UPDATE cohorts SET preemption_strategies = '"LessThanInitialShare"' WHERE name = 'org'""",
            "ck_cohorts_preemption_strategies",
        ),
    ],
)
async def test_the_database_refuses_a_quota_mode_or_strategies_berth_does_not_know(
    sessions, statement: str, constraint: str
) -> None:
    await _apply(sessions)
    with pytest.raises(IntegrityError, match=constraint):
        async with sessions.begin() as session:
            await session.execute(text(statement))
