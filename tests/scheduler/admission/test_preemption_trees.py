"""Preemption in cohort trees and under fair sharing (scheduler/admission/preemption.py), each case with the victims it
expects and the upstream rule it encodes:

- Kueue's classic hierarchical reclaim (pkg/scheduler/preemption/classical, hierarchical_preemption.go): another
  queue's workloads are candidates only while that queue borrows and so does every cohort between it and the
  lowest cohort it shares with the preemptor; a preemptor that fits below that cohort reclaims without borrowing
  (`borrowWithinCohort` does not apply); each candidate is re-checked as earlier ones are taken.
- Kueue's fair-sharing preemption (preemption.go, fairsharing/): targets by largest share; `LessThanOrEqualToFinal
  Share` then `LessThanInitialShare`, compared between the two subtrees under their lowest common cohort; a
  preemptor within its nominal quota reclaims whatever the shares; `borrowWithinCohort` is not used.
"""

from __future__ import annotations

import dataclasses

from contracts.placement import PlacementRequest
from contracts.vocabulary import ReclaimWithinCohort
from scheduler.admission.preemption import Preemption, Preemptor, Running, plan_preemption
from scheduler.snapshot import Snapshot
from scheduler.views import PreemptionPolicy
from tests.scheduler.admission.test_queueing import ONE_H100_NODE, Pool, Tenant, world

RECLAIM = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)
TWO_NODES: list[Pool] = [("h100", "H100", 8, 2, "a")]
TREE = {"org": "{}", "red": "{parentName: org}", "blue": "{parentName: org}"}


def reclaiming(snapshot: Snapshot, *tenants: str) -> Snapshot:
    views = dict(snapshot.tenants)
    for name in tenants:
        views[name] = dataclasses.replace(views[name], preemption=RECLAIM)
    return snapshot.with_tenants(views.values())


def running(allocation_id: str, tenant: str, node: str, gpus: int, started: float, priority: int = 0) -> Running:
    return Running(allocation_id, tenant, node, gpus, priority, started)


def preemptor(tenant: str, gpus: int, priority: int = 0) -> Preemptor:
    return Preemptor("new", tenant, priority, 100.0, PlacementRequest(gpu_count=gpus, tenant=tenant))


def victims(outcome: Preemption | str) -> list[str]:
    assert isinstance(outcome, Preemption), outcome
    return sorted(v.allocation_id for v in outcome.victims)


def test_a_lender_in_a_sibling_cohort_reclaims_what_the_other_subtree_borrows() -> None:
    """Two levels: b1 (cohort blue) borrows red's 4 through org; r1, within its nominal quota, takes them back."""
    tenants: dict[str, Tenant] = {"r1": (4, 1, "red"), "b1": (4, 1, "blue")}
    holds = (("b1", "a01", 4), ("b1", "a02", 4))
    fleet = reclaiming(world(TWO_NODES, *holds, tenants=tenants, cohorts=TREE), "r1")
    on_nodes = [running("held-0", "b1", "a01", 4, 10.0), running("held-1", "b1", "a02", 4, 20.0)]
    outcome = plan_preemption(fleet, "r1", preemptor("r1", 2), on_nodes, "quota_exceeded")
    assert victims(outcome) == ["held-1"]  # the newest of what b1 borrows
    assert (
        outcome.reasons["held-1"]
        == "reclaimWithinCohort Any: its tenant borrows in cohort org (Kueue: InCohortReclamation)"
    )


def test_a_tenant_that_borrows_only_inside_its_own_cohort_is_not_reclaimed_from_by_another_cohort() -> None:
    """r2 borrows r1's unused quota inside red, but red as a whole stays within its quota: blue's b1 may not take
    from it (the subtree between r2 and org does not borrow), while r1, r2's sibling, may."""
    tenants: dict[str, Tenant] = {"r1": (4, 1, "red"), "r2": (4, 1, "red"), "b1": (8, 1, "blue")}
    holds = (("r2", "a01", 6),)
    fleet = reclaiming(world(ONE_H100_NODE, *holds, tenants=tenants, cohorts=TREE), "r1", "b1")
    on_node = [running("held-0", "r2", "a01", 6, 10.0)]
    assert isinstance(plan_preemption(fleet, "r1", preemptor("b1", 4), on_node, "insufficient_capacity"), str)
    outcome = plan_preemption(fleet, "r1", preemptor("r1", 4), on_node, "insufficient_capacity")
    assert victims(outcome) == ["held-0"]
    assert outcome.reasons["held-0"].endswith("its tenant borrows in cohort red (Kueue: InCohortReclamation)")


def test_a_candidate_whose_tenant_stopped_borrowing_is_passed_over() -> None:
    """Kueue re-checks each candidate as it takes them: once b's newest allocation is gone b no longer borrows, so
    its other one is passed over for c's, though b's come first in the order (lower priority)."""
    tenants: dict[str, Tenant] = {"a": (4, 1, "lab"), "b": (2, 1, "lab"), "c": (2, 1, "lab")}
    holds = (("b", "a01", 2), ("b", "a01", 2), ("c", "a01", 2), ("c", "a01", 2))  # b and c borrow a's 4
    fleet = reclaiming(world(ONE_H100_NODE, *holds, tenants=tenants), "a")
    on_node = [
        running("held-0", "b", "a01", 2, 10.0, priority=0),
        running("held-1", "b", "a01", 2, 20.0, priority=0),
        running("held-2", "c", "a01", 2, 30.0, priority=5),
        running("held-3", "c", "a01", 2, 40.0, priority=5),
    ]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 4, priority=10), on_node, "quota_exceeded")
    assert victims(outcome) == ["held-1", "held-3"]


FAIR = {"lab": "{gpuQuota: 8, fairSharing: {enabled: true}}"}
CLASSIC = {"lab": "{gpuQuota: 8}"}


def _two_borrowers(cohorts: dict[str, str], a_holds: int) -> tuple[Snapshot, list[Running]]:
    """a and b have no quota of their own and borrow the cohort's 8; b holds the rest in 2-GPU allocations."""
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab")}
    b_allocations = (8 - a_holds) // 2
    holds = [("a", "a01", a_holds)] if a_holds else []
    holds += [("b", "a01", 2)] * b_allocations
    fleet = reclaiming(world(ONE_H100_NODE, *holds, tenants=tenants, cohorts=cohorts), "a")
    first = 1 if a_holds else 0  # held-N are numbered in the order of the holds
    return fleet, [running(f"held-{first + i}", "b", "a01", 2, 10.0 + i) for i in range(b_allocations)]


def test_with_fair_sharing_two_equal_borrowers_rebalance_and_without_it_nothing_moves() -> None:
    """Two tenants that both only borrow: classic preemption takes nothing (a would still borrow, and
    borrowWithinCohort is Never); fair sharing lets a take from b while a's share with its request stays at or
    below b's once the allocation is gone (LessThanOrEqualToFinalShare), so they meet at 4 and 4."""
    classic, b_running = _two_borrowers(CLASSIC, 0)
    assert isinstance(plan_preemption(classic, "r1", preemptor("a", 2), b_running, "quota_exceeded"), str)

    fair, b_running = _two_borrowers(FAIR, 0)
    outcome = plan_preemption(fair, "r1", preemptor("a", 2), b_running, "quota_exceeded")
    assert victims(outcome) == ["held-3"]  # a: 2/8 with it, b: 6/8 without the newest
    assert outcome.reasons["held-3"] == (
        "reclaimWithinCohort Any: its tenant borrows in cohort lab (Kueue: InCohortFairSharing)"
    )
    fair, b_running = _two_borrowers(FAIR, 2)  # a: 4/8 with it, b: 4/8 without one: still <=
    assert victims(plan_preemption(fair, "r1", preemptor("a", 2), b_running, "quota_exceeded")) == ["held-3"]
    fair, b_running = _two_borrowers(FAIR, 4)  # a: 6/8 with it > b: 2/8 without one, and not < b's 4/8 now
    assert isinstance(plan_preemption(fair, "r1", preemptor("a", 2), b_running, "quota_exceeded"), str)


def test_with_fair_sharing_a_preemptor_within_its_nominal_quota_reclaims_whatever_the_shares() -> None:
    tenants: dict[str, Tenant] = {"a": (4, 1, "lab"), "b": (4, 1, "lab")}
    lab = {"lab": "{fairSharing: {enabled: true}}"}
    fleet = reclaiming(world(ONE_H100_NODE, ("b", "a01", 8), tenants=tenants, cohorts=lab), "a")  # b borrows a's 4
    outcome = plan_preemption(
        fleet, "r1", preemptor("a", 4), [running("held-0", "b", "a01", 8, 10.0)], "quota_exceeded"
    )
    assert victims(outcome) == ["held-0"]
    # Kueue names it as the classic rule: the shares did not decide.
    assert outcome.reasons["held-0"] == (
        "reclaimWithinCohort Any: its tenant borrows in cohort lab (Kueue: InCohortReclamation)"
    )


def test_with_fair_sharing_the_subtrees_under_the_lowest_common_cohort_are_compared() -> None:
    """org shares fairly; red (r1, r2) and blue (b1) meet at org, so r1's reclaim from b1 compares red's share with
    blue's, not r1's with b1's: red already borrows as much as blue, so r1 takes nothing from b1."""
    cohorts = {
        "org": "{gpuQuota: 8, fairSharing: {enabled: true}}",
        "red": "{parentName: org}",
        "blue": "{parentName: org}",
    }
    tenants: dict[str, Tenant] = {"r1": (0, 1, "red"), "r2": (0, 1, "red"), "b1": (0, 1, "blue")}
    holds = (("r2", "a01", 4), ("b1", "a01", 2), ("b1", "a01", 2))
    fleet = reclaiming(world(ONE_H100_NODE, *holds, tenants=tenants, cohorts=cohorts), "r1")
    on_node = [running("held-1", "b1", "a01", 2, 10.0), running("held-2", "b1", "a01", 2, 20.0)]
    # red with r1's 2: 6/8; blue without one allocation: 2/8; and 6/8 is not below blue's 4/8 now either.
    assert isinstance(plan_preemption(fleet, "r1", preemptor("r1", 2), on_node, "quota_exceeded"), str)
