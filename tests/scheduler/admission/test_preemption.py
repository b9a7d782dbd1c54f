"""Preemption's victims in hand-built fleets: each case states the victims it expects and why.

The rules are Kueue's (its preemption documentation: withinClusterQueue, reclaimWithinCohort, borrowWithinCohort,
the candidate order "borrowing workloads of other ClusterQueues first, then lower priority, then the most recently
admitted", and the minimisation that gives back every victim no longer needed) and kube-scheduler's choice of node
(the node whose most important victim has the lowest priority, then the fewest victims, then the latest start).
"""

from __future__ import annotations

import dataclasses

from contracts.placement import PlacementRequest
from contracts.vocabulary import BorrowWithinCohort, ReclaimWithinCohort, WithinTenant
from scheduler.admission.admit import Nomination, admission_pass
from scheduler.admission.preemption import Preemption, Preemptor, Running, plan_preemption
from scheduler.snapshot import Snapshot
from scheduler.views import PreemptionPolicy
from tests.scheduler.admission.test_queueing import BEST_EFFORT, ONE_H100_NODE, Pool, queued, world

TWO_H100_NODES: list[Pool] = [("h100", "H100", 8, 2, "a")]
WITHIN = PreemptionPolicy(within_tenant=WithinTenant.LOWER_PRIORITY)


def policy(snapshot: Snapshot, **by_tenant: object) -> Snapshot:
    """Tenants' policies and cohorts: `a=(PreemptionPolicy, cohort)`."""
    tenants = dict(snapshot.tenants)
    for name, (preemption, cohort) in by_tenant.items():  # type: ignore[misc]
        tenants[name] = dataclasses.replace(tenants[name], preemption=preemption, cohort=cohort)
    return snapshot.with_tenants(tenants.values())


def running(
    allocation_id: str, tenant: str, node: str, gpus: int, priority: int, started: float, **extra: object
) -> Running:
    return Running(allocation_id, tenant, node, gpus, priority, started, **extra)  # type: ignore[arg-type]


def preemptor(tenant: str, gpus: int, priority: int, *, created: float = 100.0, **extra: object) -> Preemptor:
    request = PlacementRequest(gpu_count=gpus, tenant=tenant)
    return Preemptor("new", tenant, priority, created, request, **extra)  # type: ignore[arg-type]


def victims(outcome: Preemption | str) -> list[str]:
    assert isinstance(outcome, Preemption), outcome
    return [v.allocation_id for v in outcome.victims]


# Capacity decides: the quota allows it, no node has room.


def test_within_tenant_lower_priority_takes_the_lowest_then_the_newest_and_only_what_is_needed() -> None:
    # a01 is full: held-0 (4 GPUs, priority 0, started 10), held-1 (2, priority 0, started 20), held-2 (2, prio 5).
    fleet = policy(world(ONE_H100_NODE, ("a", "a01", 4), ("a", "a01", 2), ("a", "a01", 2)), a=(WITHIN, None))
    on_node = [
        running("held-0", "a", "a01", 4, 0, 10.0),
        running("held-1", "a", "a01", 2, 0, 20.0),
        running("held-2", "a", "a01", 2, 5, 30.0),
    ]
    # 2 GPUs: the newest of the lowest priority (held-1) frees enough alone.
    assert victims(plan_preemption(fleet, "r1", preemptor("a", 2, 10), on_node, "insufficient_capacity")) == ["held-1"]
    # 4 GPUs: held-1 (2) is taken first, then held-0 (4); held-1 is then no longer needed and is given back.
    outcome = plan_preemption(fleet, "r1", preemptor("a", 4, 10), on_node, "insufficient_capacity")
    assert victims(outcome) == ["held-0"] and outcome.node == "a01" and outcome.case == "capacity"
    assert outcome.reasons["held-0"] == "withinTenant LowerPriority: priority 0 < 10 (Kueue: InClusterQueue)"


def test_nothing_of_equal_or_higher_priority_and_nothing_without_a_policy() -> None:
    fleet = world(ONE_H100_NODE, ("a", "a01", 8))
    on_node = [running("held-0", "a", "a01", 8, 10, 10.0)]
    no_policy = plan_preemption(fleet, "r1", preemptor("a", 2, 100), on_node, "insufficient_capacity")
    assert isinstance(no_policy, str) and "preemption policy displaces nothing" in no_policy
    equal = plan_preemption(
        policy(fleet, a=(WITHIN, None)), "r1", preemptor("a", 2, 10), on_node, "insufficient_capacity"
    )
    assert isinstance(equal, str)


def test_newer_equal_priority_is_taken_only_under_lower_or_newer_equal_priority() -> None:
    newer = PreemptionPolicy(within_tenant=WithinTenant.LOWER_OR_NEWER_EQUAL_PRIORITY)
    fleet = policy(world(ONE_H100_NODE, ("a", "a01", 4), ("a", "a01", 4)), a=(newer, None))
    on_node = [running("held-0", "a", "a01", 4, 10, 50.0), running("held-1", "a", "a01", 4, 10, 150.0)]
    # The request was made at 100: held-1 started after it (newer, equal priority), held-0 before.
    assert victims(plan_preemption(fleet, "r1", preemptor("a", 4, 10), on_node, "insufficient_capacity")) == ["held-1"]


def test_a_preemptible_allocation_is_anyones_but_never_for_a_preemptible_request() -> None:
    fleet = world(ONE_H100_NODE, ("b", "a01", 8))
    spot = [running("held-0", "b", "a01", 8, 0, 10.0, preemptible=True)]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 8, 0), spot, "insufficient_capacity")
    assert victims(outcome) == ["held-0"] and outcome.reasons["held-0"] == "of a preemptible PriorityClass"
    assert isinstance(
        plan_preemption(fleet, "r1", preemptor("a", 8, 0, preemptible=True), spot, "insufficient_capacity"), str
    )


def test_the_node_whose_most_important_victim_matters_least_wins_then_the_fewest_victims() -> None:
    # a01: one spot allocation of priority 50; a02: two spot allocations of priority 5 and 1. Spot ones are
    # anyone's; a02's most important victim (5) matters less than a01's (50), though it has two.
    fleet = world(TWO_H100_NODES, ("b", "a01", 8), ("b", "a02", 4), ("b", "a02", 4))
    spot = [
        running("held-0", "b", "a01", 8, 50, 10.0, preemptible=True),
        running("held-1", "b", "a02", 4, 5, 20.0, preemptible=True),
        running("held-2", "b", "a02", 4, 1, 30.0, preemptible=True),
    ]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 8, 100), spot, "insufficient_capacity")
    assert outcome.node == "a02" and sorted(victims(outcome)) == ["held-1", "held-2"]
    # Equal importance (priority 5 on both nodes): the fewest victims.
    even = [dataclasses.replace(spot[0], priority=5), *spot[1:]]
    assert victims(plan_preemption(fleet, "r1", preemptor("a", 8, 100), even, "insufficient_capacity")) == ["held-0"]


def test_a_victim_whose_removal_does_not_free_a_placement_is_never_taken() -> None:
    # a01 has 4 GPUs of spot and 4 of a non-preemptible allocation: freeing the spot leaves 4 free, too few for 8.
    fleet = world(ONE_H100_NODE, ("b", "a01", 4), ("c", "a01", 4))
    on_node = [running("held-0", "b", "a01", 4, 0, 10.0, preemptible=True), running("held-1", "c", "a01", 4, 0, 20.0)]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 8, 100), on_node, "insufficient_capacity")
    assert isinstance(outcome, str)


def test_newer_means_requested_later_not_started_later() -> None:
    """Kueue's LowerOrNewerEqualPriority compares the workloads' creation times: an allocation requested before the
    preemptor is not newer, however late it started (it may have waited in its queue)."""
    newer = PreemptionPolicy(within_tenant=WithinTenant.LOWER_OR_NEWER_EQUAL_PRIORITY)
    fleet = policy(world(ONE_H100_NODE, ("a", "a01", 4), ("a", "a01", 4)), a=(newer, None))
    on_node = [
        running("held-0", "a", "a01", 4, 10, 150.0, created=50.0),  # requested before, started after: not newer
        running("held-1", "a", "a01", 4, 10, 140.0, created=120.0),  # requested after the preemptor's 100
    ]
    assert victims(plan_preemption(fleet, "r1", preemptor("a", 4, 10), on_node, "insufficient_capacity")) == ["held-1"]


def test_allocations_of_a_tenant_that_borrows_now_go_first_whatever_each_was_marked() -> None:
    """Kueue orders candidates by their ClusterQueue's state at the decision (pkg/scheduler/preemption:
    candidatesOrdering puts workloads of other ClusterQueues that are borrowing first, then lower priority), not by
    what each workload borrowed when it was admitted. b borrows now (12 of a quota of 8), so its allocation on a01,
    claimed while b was within its quota, goes before a's own lower-priority one there."""
    fleet = world(
        TWO_H100_NODES,
        ("a", "a01", 4),
        ("b", "a01", 4),
        ("b", "a02", 8),
        tenants={"a": (8, 1), "b": (8, 1), "d": (8, 1)},
    )
    both = PreemptionPolicy(within_tenant=WithinTenant.LOWER_PRIORITY, reclaim_within_cohort=ReclaimWithinCohort.ANY)
    fleet = policy(fleet, a=(both, "c"), b=(PreemptionPolicy(), "c"), d=(PreemptionPolicy(), "c"))
    held = [
        running("held-0", "a", "a01", 4, 0, 10.0),
        running("held-1", "b", "a01", 4, 5, 20.0, borrowed=0),  # claimed within b's quota
        running("held-2", "b", "a02", 8, 5, 5.0, borrowed=4),
    ]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 4, 10), held, "insufficient_capacity")
    assert victims(outcome) == ["held-1"] and outcome.node == "a01"
    assert outcome.reasons["held-1"] == (
        "reclaimWithinCohort Any: its tenant borrows in cohort c (Kueue: InCohortReclamation)"
    )


def test_a_non_preemptible_allocation_is_never_a_victim_and_a_never_class_displaces_nobody() -> None:
    """KAI-Scheduler never preempts a non-preemptible workload; Kubernetes' `preemptionPolicy: Never` makes a class
    whose pods wait rather than preempt."""
    fleet = policy(world(ONE_H100_NODE, ("a", "a01", 4), ("a", "a01", 4)), a=(WITHIN, None))
    on_node = [
        running("held-0", "a", "a01", 4, 0, 10.0, non_preemptible=True),
        running("held-1", "a", "a01", 4, 5, 20.0),
    ]
    # held-0 is the lowest priority, yet held-1 is taken: held-0 may never be.
    assert victims(plan_preemption(fleet, "r1", preemptor("a", 4, 10), on_node, "insufficient_capacity")) == ["held-1"]
    assert isinstance(plan_preemption(fleet, "r1", preemptor("a", 8, 10), on_node, "insufficient_capacity"), str)
    assert plan_preemption(
        fleet, "r1", preemptor("a", 4, 10, never_preempts=True), on_node, "insufficient_capacity"
    ) == ("its PriorityClass never preempts (preemptionPolicy: Never)")


# Quota decides: the tenant or its cohort has no quota left, the fleet has room.


def test_reclaiming_lent_capacity_takes_the_newest_borrower_and_only_under_the_policy() -> None:
    # Cohort c: b (quota 0) borrows a's quota and fills a01; d fills a02. a asks for 4 within its own quota of 8:
    # its quota fits, no node has room, and b's borrowing allocations are reclaimable.
    fleet = world(
        TWO_H100_NODES,
        ("b", "a01", 4),
        ("b", "a01", 4),
        ("d", "a02", 8),
        tenants={"a": (8, 1), "b": (0, 1), "d": (8, 1)},
    )
    reclaim = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)
    fleet = policy(fleet, a=(reclaim, "c"), b=(PreemptionPolicy(), "c"))
    borrowing = [
        running("held-0", "b", "a01", 4, 100, 10.0, borrowed=4),
        running("held-1", "b", "a01", 4, 100, 20.0, borrowed=4),
        running("held-2", "d", "a02", 8, 0, 5.0),  # d's own quota, and not of a's cohort: never a candidate
    ]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 4, 0), borrowing, "insufficient_capacity")
    # `Any` reclaims whatever the borrower's priority; the newest goes first, and one frees enough.
    assert victims(outcome) == ["held-1"] and outcome.node == "a01"
    assert outcome.reasons["held-1"] == (
        "reclaimWithinCohort Any: its tenant borrows in cohort c (Kueue: InCohortReclamation)"
    )
    lower_only = policy(fleet, a=(PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.LOWER_PRIORITY), "c"))
    assert isinstance(plan_preemption(lower_only, "r1", preemptor("a", 4, 0), borrowing, "insufficient_capacity"), str)


def test_quota_decides_within_the_tenant_and_the_fleet_has_room_elsewhere() -> None:
    # a's quota is 8 and it holds 8 at priority 0 (two allocations); a02 is free. It asks for 4 at priority 10.
    fleet = policy(
        world(TWO_H100_NODES, ("a", "a01", 4), ("a", "a01", 4), tenants={"a": (8, 1), "b": (8, 1)}), a=(WITHIN, None)
    )
    held = [running("held-0", "a", "a01", 4, 0, 10.0), running("held-1", "a", "a01", 4, 0, 20.0)]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 4, 10), held, "quota_exceeded")
    assert victims(outcome) == ["held-1"] and outcome.case == "quota" and outcome.node is None
    # 16 GPUs could never fit a quota of 8: nothing is preempted.
    assert plan_preemption(fleet, "r1", preemptor("a", 16, 10), held, "quota_exceeded") == (
        "displacing every allocation its policy allows would still not fit its quota"
    )


def test_a_request_that_would_still_borrow_reclaims_only_under_borrow_within_cohort() -> None:
    # a's quota is 4; it asks for 8, so it borrows 4 once placed. b borrows too.
    fleet = world(TWO_H100_NODES, ("b", "a01", 8), ("b", "a02", 4), tenants={"a": (4, 1), "b": (4, 1), "d": (8, 1)})
    base = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)
    fleet = policy(fleet, a=(base, "c"), b=(PreemptionPolicy(), "c"), d=(PreemptionPolicy(), "c"))
    # held-0 fills a01 (b's 8); held-1 borrows 4 on a02, beside 4 free GPUs.
    borrowing = [running("held-0", "b", "a01", 8, 0, 5.0), running("held-1", "b", "a02", 4, 0, 10.0, borrowed=4)]
    refused = plan_preemption(fleet, "r1", preemptor("a", 8, 10), borrowing, "insufficient_capacity")
    assert isinstance(refused, str)  # borrowWithinCohort Never: no reclaiming while it borrows
    allowed = dataclasses.replace(
        base, borrow_within_cohort=BorrowWithinCohort.LOWER_PRIORITY, max_priority_threshold=0
    )
    outcome = plan_preemption(
        policy(fleet, a=(allowed, "c")), "r1", preemptor("a", 8, 10), borrowing, "insufficient_capacity"
    )
    # priority 0 <= threshold 0 < 10: held-1 alone frees a02's 8 (4 free beside it).
    assert victims(outcome) == ["held-1"] and outcome.node == "a02"
    assert outcome.reasons["held-1"].endswith("(Kueue: InCohortReclaimWhileBorrowing)")
    above = dataclasses.replace(allowed, max_priority_threshold=-1)
    assert isinstance(
        plan_preemption(policy(fleet, a=(above, "c")), "r1", preemptor("a", 8, 10), borrowing, "insufficient_capacity"),
        str,
    )


def test_classic_preemption_compares_no_shares_a_lender_reclaims_whatever_the_borrower_keeps() -> None:
    """Kueue without fair sharing (its default): withinClusterQueue, reclaimWithinCohort and borrowWithinCohort
    decide, and no share is compared (pkg/scheduler/preemption: the classic strategy). b borrows 4 of a's quota;
    a reclaims them though b keeps nothing and a would then hold 12 of 16."""
    holds = (("a", "a01", 8), ("b", "a02", 4), ("b", "a02", 4))
    fleet = world(TWO_H100_NODES, *holds, tenants={"a": (12, 1), "b": (4, 1)})
    fleet = policy(
        fleet, a=(PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY), "c"), b=(PreemptionPolicy(), "c")
    )
    borrowing = [running("held-1", "b", "a02", 4, 0, 10.0, borrowed=4), running("held-2", "b", "a02", 4, 0, 11.0)]
    outcome = plan_preemption(fleet, "r1", preemptor("a", 4, 10), borrowing, "insufficient_capacity")
    assert victims(outcome) == ["held-2"] and outcome.node == "a02"  # the newest of b's, either frees enough


# In the admission pass: a nomination is made once, holds its node, and places its request there.


def test_a_pass_nominates_a_node_holds_it_while_its_victims_leave_and_places_the_preemptor_there() -> None:
    fleet = world(TWO_H100_NODES, ("b", "a01", 8), ("b", "a02", 6))
    spot = [running("held-0", "b", "a01", 8, 0, 10.0, preemptible=True), running("held-1", "b", "a02", 6, 0, 5.0)]
    urgent = queued("urgent", "a", 1, 8, priority=100)
    small = queued("small", "c", 2, 2)  # fits a02's 2 free GPUs, never a01
    first = admission_pass(fleet, [urgent, small], {}, BEST_EFFORT, spot)
    by_id = {v.allocation_id: v for v in first.verdicts}
    assert by_id["urgent"].code == "preempting" and by_id["urgent"].nomination == Nomination("a01", ("held-0",))
    assert by_id["urgent"].preempt_reasons == {"held-0": "of a preemptible PriorityClass"}
    assert by_id["urgent"].reason == "preempting 1 allocation(s) on node a01: held-0: of a preemptible PriorityClass"
    assert by_id["small"].node == "a02"

    # The next pass, held-0 still leaving: the nomination stands (no second preemption), a01 stays held for it.
    kept = {"urgent": by_id["urgent"].nomination}
    latecomer = queued("late", "c", 3, 8, priority=1000)
    second = admission_pass(fleet, [urgent, latecomer], {}, BEST_EFFORT, spot, kept)
    again = {v.allocation_id: v for v in second.verdicts}
    assert again["urgent"].reason == "preempting 1 allocation(s) on node a01: waiting for them to leave"
    assert again["urgent"].preempt_reasons == {}
    assert again["late"].node is None and again["late"].nomination is None  # held-0 is taken; a01 is not its

    # held-0 has left: a01 is free and the preemptor, alone allowed there, is placed on it before the latecomer.
    freed = world(TWO_H100_NODES, ("b", "a02", 6))
    third = admission_pass(freed, [urgent, latecomer], {}, BEST_EFFORT, spot[1:], kept)
    assert [(v.allocation_id, v.node) for v in third.admitted] == [("urgent", "a01")]
