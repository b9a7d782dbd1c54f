"""Preemption within one admission pass, as Kueue's scheduler does it: a request given a preemption is charged to
its tenant before the pass goes on (Kueue adds a preempting workload's usage, `cq.AddUsage`, before it issues the
preemptions), so a tenant whose quota has room for one request never takes victims for two in one pass.
"""

from __future__ import annotations

import dataclasses

from contracts.vocabulary import BorrowWithinCohort, ReclaimWithinCohort
from scheduler.admission.admit import QueuedRequest, admission_pass
from scheduler.admission.preemption import Running
from scheduler.snapshot import Snapshot
from scheduler.views import PreemptionPolicy
from tests.scheduler.admission.test_preemption import ONE_H100_NODE, WITHIN, policy, running
from tests.scheduler.admission.test_queueing import BEST_EFFORT, queued, world

RECLAIM = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)


def _b_borrows_the_node() -> tuple[Snapshot, list[Running]]:
    """One node of 8, held by four 2-GPU allocations of b (quota 6, so borrowing 2 of a's 2); a may reclaim."""
    fleet = world(ONE_H100_NODE, *[("b", "a01", 2)] * 4, tenants={"a": (2, 1, "c"), "b": (6, 1, "c")})
    fleet = policy(fleet, a=(RECLAIM, "c"), b=(PreemptionPolicy(), "c"))
    return fleet, [running(f"held-{i}", "b", "a01", 2, 0, 10.0 + i) for i in range(4)]


def test_a_tenant_with_room_for_one_request_reclaims_for_one_not_two_in_a_pass() -> None:
    # One node of 8, all of it b's: b's quota is 6, so it borrows 2 of a's 2. a queues two requests of 2: its quota
    # has room for the first alone; once it is charged, the second would borrow, and borrowWithinCohort is Never.
    fleet, on_node = _b_borrows_the_node()
    first, second = queued("first", "a", 1, 2), queued("second", "a", 2, 2)

    result = admission_pass(fleet, [first, second], {}, BEST_EFFORT, on_node)

    by_id = {v.allocation_id: v for v in result.verdicts}
    assert by_id["first"].code == "preempting" and by_id["first"].nomination is not None
    assert by_id["first"].nomination.victims == ("held-3",)  # the newest of b's borrowing allocations
    assert by_id["second"].code == "quota_exceeded", by_id["second"].reason
    assert by_id["second"].nomination is None
    assert by_id["second"].reason is not None and "would exceed" in by_id["second"].reason


def test_a_kept_nomination_is_charged_too_so_a_later_pass_takes_no_second_victim() -> None:
    fleet, on_node = _b_borrows_the_node()
    first, second = queued("first", "a", 1, 2), queued("second", "a", 2, 2)
    nominated = admission_pass(fleet, [first], {}, BEST_EFFORT, on_node)
    [verdict] = nominated.verdicts
    assert verdict.nomination is not None

    # The next pass, held-3 still leaving: the second request arrives; the first's nomination holds its quota.
    later = admission_pass(fleet, [first, second], {}, BEST_EFFORT, on_node, {"first": verdict.nomination})

    by_id = {v.allocation_id: v for v in later.verdicts}
    assert by_id["first"].nomination == verdict.nomination
    assert by_id["second"].nomination is None and by_id["second"].code == "quota_exceeded"


# A non-preemptible request is admitted only within its tenant's nominal quota, all its usage counted (Berth keeps
# its quota a cap for everything a tenant runs; KAI counts only non-preemptible usage: docs/queues-and-quotas.md).
# Preemption then judges "fits" by that same rule, and never plans a preemption that takes nothing.

TWO_H100_NODES = [("h100", "H100", 8, 2, "a")]


def _non_preemptible(allocation: str, tenant: str, gpus: int, priority: int) -> QueuedRequest:
    entry = queued(allocation, tenant, 1, gpus, priority=priority)
    return dataclasses.replace(entry, request=entry.request.model_copy(update={"within_nominal": True}))


def test_a_non_preemptible_request_over_its_nominal_quota_waits_rather_than_preempting_nothing() -> None:
    # a uses its whole quota (4); b borrows 2 of idle t's; the cohort has 2 GPUs to lend, and nodes have room. a may
    # reclaim from b even while it would borrow itself (borrowWithinCohort), so b's allocation is a candidate.
    fleet = world(
        TWO_H100_NODES,
        ("a", "a01", 4),
        ("b", "a02", 6),
        tenants={"a": (4, 1, "c"), "b": (4, 1, "c"), "t": (4, 1, "c")},
    )
    greedy = dataclasses.replace(RECLAIM, borrow_within_cohort=BorrowWithinCohort.LOWER_PRIORITY)
    fleet = policy(fleet, a=(greedy, "c"), b=(PreemptionPolicy(), "c"), t=(PreemptionPolicy(), "c"))
    holding = [running("held-0", "a", "a01", 4, 0, 10.0), running("held-1", "b", "a02", 6, 0, 20.0)]

    result = admission_pass(fleet, [_non_preemptible("serving", "a", 2, 500)], {}, BEST_EFFORT, holding)

    [verdict] = result.verdicts
    assert verdict.nomination is None, verdict.reason  # reclaiming b's GPUs would not bring a within its quota
    assert verdict.code == "quota_exceeded"
    assert verdict.reason is not None and "non-preemptible PriorityClass is admitted only within" in verdict.reason


def test_a_non_preemptible_request_displaces_its_own_tenants_lower_priority_work_to_fit_its_nominal_quota() -> None:
    fleet = world(
        TWO_H100_NODES,
        ("a", "a01", 2),
        ("a", "a01", 2),
        tenants={"a": (4, 1, "c"), "b": (4, 1, "c")},
    )
    fleet = policy(fleet, a=(WITHIN, "c"), b=(PreemptionPolicy(), "c"))
    holding = [running("held-0", "a", "a01", 2, 0, 10.0), running("held-1", "a", "a01", 2, 0, 20.0)]

    result = admission_pass(fleet, [_non_preemptible("serving", "a", 2, 500)], {}, BEST_EFFORT, holding)

    [verdict] = result.verdicts
    assert verdict.nomination is not None and verdict.nomination.victims == ("held-1",), verdict.reason
    assert verdict.reason is not None and verdict.reason.startswith("preempting 1 allocation(s) for its quota")


def test_a_queue_whose_every_tenant_has_weight_zero_is_walked_like_any_other() -> None:
    """The holds beyond a tenant's head weigh tenants by weight; with every waiting tenant at weight 0 there is no
    share to be below, so each gets its head's hold, and the pass decides as it would otherwise."""
    fleet = world(ONE_H100_NODE, ("b", "a01", 4), tenants={"zero": (8, 0), "a": (8, 0), "b": (8, 1)})
    queue = [queued("big-zero", "zero", 1, 8), queued("big-a", "a", 2, 8), queued("small-a", "a", 3, 4)]

    result = admission_pass(fleet, queue, {}, BEST_EFFORT)

    by_id = {v.allocation_id: v for v in result.verdicts}
    assert by_id["big-zero"].reserved == "a01"  # the first head the node can hold once b's 4 leave
    assert by_id["big-a"].code == by_id["small-a"].code == "insufficient_capacity"
    assert result.admitted == []  # a01's free 4 are held for big-zero
