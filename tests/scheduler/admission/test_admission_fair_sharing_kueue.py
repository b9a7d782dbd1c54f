"""Decayed fair share held to Kueue's admission fair sharing (AFS): the examples of its documentation
(site/content/en/docs/concepts/admission_fair_sharing.md), its design (keps/4136-admission-fair-sharing/README.md)
and its tests (pkg/scheduler/scheduler_afs_test.go, pkg/cache/queue/cluster_queue_test.go, pkg/controller/core/
localqueue_controller_test.go, test/integration/singlecluster/scheduler/fairsharing/fair_sharing_test.go), all in
kubernetes-sigs/kueue, retold with tenants for LocalQueues and GPUs for resources.

How Berth's mapping differs from Kueue's, and what each test therefore sets up:

- Kueue orders the LocalQueues of one ClusterQueue (the KEP's admission scope may be a cohort too); Berth orders the
  tenants of a cohort tree whose root sets `fairSharing: {enabled: true, usageHalfLife: ...}`. A tenant is both a
  LocalQueue (its weight, its usage) and a ClusterQueue (its quota): where a test follows the LocalQueues of one
  ClusterQueue, its tenants have no quota of their own and the root has the ClusterQueue's, so every request would
  borrow and usage over weight decides. A request within its tenant's nominal quota goes before one that would
  borrow, as the KEP's cohort scope has it; at each cohort of the tree, its subtree's usage over its weight.
- Kueue's `consumedResources` is an average of what a LocalQueue holds (GPUs), updated every
  `usageSamplingInterval` S by `new = 2^(-S/H) * old + (1 - 2^(-S/H)) * held now` (H: `usageHalfLifeTime`). Berth
  computes decayed GPU-seconds exactly from the ledger's intervals (scheduler/quota/usage_decay.py). Where what is
  held stays the same between samples, Berth's value is Kueue's times H / ln 2, one factor for every tenant of a
  tree, so the order is the same (`from_kueue` converts). Kueue counts what is held at a sample as held since the
  previous one; Berth counts an interval from when it began.
- Kueue's entry penalty is `(1 - 0.5^(S/H))` times the admitted workload's requests (the KEP: the usage of a job
  admitted one sampling interval ago), added to its LocalQueue's usage when the workload is assumed and settled into
  its consumed usage on admission, where it decays with the rest. Berth charges each GPU ENTRY_PENALTY_SECONDS
  (Kueue's default S, 300 s) of usage, undecayed, for the rest of the pass only; the next pass reads the ledger,
  where the request's own interval has begun. The amounts differ by a factor (S ln 2 / H) / (1 - 2^(-S/H)): 1.0002
  at the 168h half-life used here, within the tolerance these tests allow; it grows for half-lives near S (1.18 at
  H = 10 minutes).
- Kueue weighs resources by `resourceWeights` and sums each over its flavors; Berth counts GPUs only, a GPU-second of
  every product alike.
- Weight 0 puts a tenant last, used or not, as Kueue's infinite usage over weight 0 does; two tenants of weight 0
  compare by their usage, where Kueue ties them and goes by priority, then arrival.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from contracts.vocabulary import ReclaimWithinCohort
from scheduler.admission.admit import PassResult, admission_pass, ordered
from scheduler.admission.preemption import Running
from scheduler.quota.usage_decay import ENTRY_PENALTY_SECONDS, Held, decayed
from scheduler.snapshot import Snapshot
from scheduler.views import PreemptionPolicy
from tests.scheduler.admission.test_queueing import ONE_H100_NODE, Pool, Tenant, queued, run, world
from tests.scheduler.quota.test_usage_decay import with_usage

HOUR = 3600.0
WEEK = 168 * HOUR  # Kueue's documented usageHalfLifeTime
SAMPLING = 300.0  # Kueue's default usageSamplingInterval
NOW = 1_800_000_000.0
LAB = {"lab": "{gpuQuota: 8, fairSharing: {enabled: true, usageHalfLife: 168h}}"}


def from_kueue(consumed: float, half_life: float = WEEK) -> float:
    """Kueue's `consumedResources` (GPUs, averaged with the half-life) as Berth's decayed GPU-seconds."""
    return consumed * half_life / math.log(2)


def kueue_penalty(gpus: int, half_life: float = WEEK) -> float:
    """Kueue's entry penalty for a request of `gpus`, (1 - 0.5^(S/H)) * gpus, in decayed GPU-seconds."""
    return from_kueue((1 - 0.5 ** (SAMPLING / half_life)) * gpus, half_life)


def lab(tenants: dict[str, Tenant], used: dict[str, float], pools: list[Pool] = ONE_H100_NODE) -> Snapshot:
    """The fleet with the tenants in `lab` (8 GPUs, ordered by usage with a week's half-life), each tenant's decayed
    usage (GPU-seconds; none given: 0) on its view."""
    return with_usage(world(pools, tenants=tenants, cohorts=LAB), used)


def order(result: PassResult) -> list[str]:
    return [v.allocation_id for v in sorted(result.verdicts, key=lambda v: v.position)]


def test_the_tenant_that_used_less_is_admitted_first_and_without_afs_arrival_decides() -> None:
    """pkg/scheduler/scheduler_afs_test.go, "admits workload from less active localqueue" and "without AFS: classic
    admission decision ignores queue usage": a has used 8 GPUs, b 2; each asks for all 8 of the quota, a first.
    With usage remembered, b's request is admitted and a's waits for quota; without it, a's (the earlier) is."""
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab")}
    queue = [queued("a-1", "a", 1, 8), queued("b-1", "b", 2, 8)]
    result = run(lab(tenants, {"a": from_kueue(8), "b": from_kueue(2)}), queue)
    assert [v.allocation_id for v in result.admitted] == ["b-1"]
    waiting = next(v for v in result.verdicts if v.allocation_id == "a-1")
    assert (waiting.position, waiting.code) == (2, "quota_exceeded")

    classic = run(world(ONE_H100_NODE, tenants=tenants, cohorts={"lab": "{gpuQuota: 8}"}), queue)
    assert [v.allocation_id for v in classic.admitted] == ["a-1"]


def test_a_tenant_of_weight_zero_goes_last_even_when_nobody_has_used_anything() -> None:
    """pkg/scheduler/scheduler_afs_test.go, "does not prioritize a zero-weight localqueue", and Kueue's
    `CalculateUsage` (usage over a weight of 0 is infinite): neither tenant has used anything, the weight-0 tenant
    asked first, and the weight-1 tenant is admitted. Where both have weight 0, arrival decides again."""
    tenants: dict[str, Tenant] = {"zero": (0, 0, "lab"), "a": (0, 1, "lab")}
    queue = [queued("zero-1", "zero", 1, 8), queued("a-1", "a", 2, 8)]
    result = run(lab(tenants, {}), queue)
    assert [v.allocation_id for v in result.admitted] == ["a-1"]
    assert order(result) == ["a-1", "zero-1"]

    both: dict[str, Tenant] = {"zero": (0, 0, "lab"), "a": (0, 0, "lab")}
    assert [request.allocation_id for request, _ in ordered(queue, lab(both, {}), {})] == ["zero-1", "a-1"]


def test_equal_usage_admits_one_request_of_each_tenant_when_quota_is_limited() -> None:
    """pkg/scheduler/scheduler_afs_test.go and the integration test (AdmissionFairSharing at ClusterQueue level),
    "admits one workload from each localqueue when quota is limited": a and b have used alike, each asks for two
    requests of 4 of the 8 GPUs, a's first. The entry penalty a's first admission charges puts b ahead: one
    request of each is admitted, not both of a's. Each verdict shows its tenant's usage with the pass's penalties.
    And "schedules normally when queues have equal usage": where everything fits, everything is admitted."""
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab")}
    used = from_kueue(4)
    queue = [queued("a-1", "a", 1, 4), queued("a-2", "a", 2, 4), queued("b-1", "b", 3, 4), queued("b-2", "b", 4, 4)]
    result = run(lab(tenants, {"a": used, "b": used}), queue)
    assert [v.allocation_id for v in result.admitted] == ["a-1", "b-1"]
    assert order(result) == ["a-1", "b-1", "a-2", "b-2"]
    by_id = {v.allocation_id: v for v in result.verdicts}
    assert {by_id["a-2"].code, by_id["b-2"].code} == {"quota_exceeded"}
    shown = [by_id[a].usage for a in order(result)]
    assert shown == pytest.approx([used, used, used + kueue_penalty(4), used + kueue_penalty(4)], rel=1e-6)

    three: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab"), "c": (0, 1, "lab")}
    alike = {t: from_kueue(2) for t in three}
    everything = run(lab(three, alike), [queued("a-1", "a", 1, 4), queued("b-1", "b", 2, 3), queued("c-1", "c", 3, 1)])
    assert [v.allocation_id for v in everything.admitted] == ["a-1", "b-1", "c-1"]


def test_the_entry_penalty_stops_a_burst_from_the_least_used_tenant_taking_every_request() -> None:
    """keps/4136-admission-fair-sharing/README.md, "Entry penalty", and the documentation's "Entry Penalty": without
    it, every request of the tenant with the lower usage would be admitted before the next sample. b has used nothing
    and sends five 1-GPU requests before a's two; a's usage is worth two and a half entry penalties of one GPU. b's
    first three go first; then b's penalties outweigh a's usage, and from there the two alternate."""
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab")}
    one = kueue_penalty(1)
    queue = [queued(f"b-{i}", "b", i, 1) for i in range(1, 6)] + [queued(f"a-{i}", "a", 5 + i, 1) for i in (1, 2)]
    result = run(lab(tenants, {"a": 2.5 * one}), queue)
    assert [v.allocation_id for v in result.admitted] == ["b-1", "b-2", "b-3", "a-1", "b-4", "a-2", "b-5"]
    assert [v.usage for v in result.admitted] == pytest.approx([k * one for k in (0, 1, 2, 2.5, 3, 3.5, 4)], rel=1e-3)
    assert ENTRY_PENALTY_SECONDS == SAMPLING  # Berth's penalty is a sampling interval of the request's GPUs


@pytest.mark.parametrize(
    ("half_life", "life", "before", "held", "expected"),
    [
        (300.0, "5m", 8, 0, 4.0),  # one half-life: half of it is left
        (300.0, "5m", 8, 4, 6.0),
        (600.0, "10m", 8, 4, 6.828427124),
        (86400.0, "24h", 8, 0, 7.980769063),
    ],
    ids=["halved", "with-running", "half-life-twice-the-interval", "long-half-life"],
)
def test_decayed_usage_is_kueues_sampled_usage_where_what_is_held_stays_the_same(
    half_life: float, life: str, before: int, held: int, expected: float
) -> None:
    """pkg/controller/core/localqueue_controller_test.go, the "local queue decaying usage ..." cases: a LocalQueue
    whose consumedResources were `before` GPUs one sampling interval (5 minutes) ago and that has held `held` GPUs
    since has `expected` now. Berth's usage of the same history (the carried sum, then the interval since), shown on
    the verdict, is the same number in GPU-seconds."""
    history = [Held(held, NOW - SAMPLING)] if held else []
    usage = decayed(from_kueue(before, half_life), NOW - SAMPLING, history, NOW, half_life)
    cohorts = {"lab": f"{{gpuQuota: 8, fairSharing: {{enabled: true, usageHalfLife: {life}}}}}"}
    fleet = with_usage(world(ONE_H100_NODE, tenants={"t": (0, 1, "lab")}, cohorts=cohorts), {"t": usage})
    [verdict] = run(fleet, [queued("t-1", "t", 1, 1)]).verdicts
    assert verdict.usage == pytest.approx(from_kueue(expected, half_life), rel=1e-9)


def test_usage_from_one_half_life_ago_counts_half_in_the_order() -> None:
    """keps/4136-admission-fair-sharing/README.md (the half-life: after it, usage has decayed to half) and the
    documentation ("usage values decay over time"): `old` held 8 GPUs for a sampling interval ending a week ago,
    `low` 3 and `high` 5 for the one ending now. `old`'s 8 count as 4: it goes between them, whatever the arrival."""
    history = {
        "old": Held(8, NOW - WEEK - SAMPLING, NOW - WEEK),
        "low": Held(3, NOW - SAMPLING, NOW),
        "high": Held(5, NOW - SAMPLING, NOW),
    }
    used = {name: decayed(0.0, None, [held], NOW, WEEK) for name, held in history.items()}
    assert used["old"] == pytest.approx(decayed(0.0, None, [Held(4, NOW - SAMPLING, NOW)], NOW, WEEK))
    tenants: dict[str, Tenant] = {name: (0, 1, "lab") for name in history}
    queue = [queued("high-1", "high", 1, 8), queued("old-1", "old", 2, 8), queued("low-1", "low", 3, 8)]
    result = run(lab(tenants, used), queue)
    assert order(result) == ["low-1", "old-1", "high-1"]
    assert [v.allocation_id for v in result.admitted] == ["low-1"]


@pytest.mark.parametrize(
    ("weights", "used", "queue", "expected"),
    [
        # "workloads are ordered by LQ usage, instead of priorities"
        ({"a": 1, "b": 1}, {"a": 2, "b": 1}, [("a-high", "a", 2), ("b-low", "b", 1)], ["b-low", "a-high"]),
        # "... with respect to LQs' fair sharing weights": b's 6 over its weight of 2 is below a's 10
        ({"a": 1, "b": 2}, {"a": 10, "b": 6}, [("a-high", "a", 2), ("b-low", "b", 1)], ["b-low", "a-high"]),
        # "workloads with the same LQ usage are ordered by priority"
        ({"a": 1}, {"a": 10}, [("a-low", "a", 1), ("a-high", "a", 2)], ["a-high", "a-low"]),
        # the documentation: weight 2 "will be treated as if it used half as many resources": a tie, priority decides
        ({"a": 1, "b": 2}, {"a": 3, "b": 6}, [("a-low", "a", 1), ("b-high", "b", 2)], ["b-high", "a-low"]),
        ({"a": 1, "b": 2}, {"a": 3, "b": 6}, [("a-high", "a", 2), ("b-low", "b", 1)], ["a-high", "b-low"]),
    ],
    ids=["usage-before-priority", "usage-over-weight", "same-usage-priority", "weight-halves-tie", "tie-other-way"],
)
def test_usage_over_weight_orders_tenants_before_priority(
    weights: dict[str, float], used: dict[str, float], queue: list[tuple[str, str, int]], expected: list[str]
) -> None:
    """pkg/cache/queue/cluster_queue_test.go, TestFsAdmission, and the documentation's LocalQueue `weight`: usage
    (Kueue's consumed GPUs) over weight first, then priority, then arrival. Each request asks for all 8 GPUs: the
    first in order is admitted."""
    tenants: dict[str, Tenant] = {name: (0, weight, "lab") for name, weight in weights.items()}
    fleet = lab(tenants, {name: from_kueue(gpus) for name, gpus in used.items()})
    requests = [queued(a, t, i, 8, priority=p) for i, (a, t, p) in enumerate(queue, start=1)]
    result = run(fleet, requests)
    assert order(result) == expected
    assert [v.allocation_id for v in result.admitted] == expected[:1]


def test_a_gpu_counts_alike_on_every_product() -> None:
    """pkg/controller/core/localqueue_controller_test.go, "local queue decaying usage sums the usage from different
    flavors and resources", and TestFsAdmission's "ordered by LQ usage with respect to resource weights": Kueue sums
    a resource over its flavors and weighs resources by `resourceWeights`. Berth counts GPUs only (as weights of 1
    for GPUs, 0 for the rest), a GPU of either product alike: a's A100 and H100 charge it what b's 2 H100s charge
    b, and the tie goes to the earlier arrival."""
    pools: list[Pool] = [("h100", "H100", 8, 1, "a"), ("a100", "A100", 8, 1, "b")]
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab")}
    queue = [
        queued("a-1", "a", 1, 1, product="A100"),
        queued("b-1", "b", 2, 2, product="H100"),
        queued("a-2", "a", 3, 1, product="H100"),
        queued("b-2", "b", 4, 1, product="A100"),
        queued("a-3", "a", 5, 1, product="A100"),
    ]
    result = run(lab(tenants, {}, pools), queue)
    assert [v.allocation_id for v in result.admitted] == ["a-1", "b-1", "a-2", "b-2", "a-3"]
    shown = [v.usage for v in result.admitted]
    expected = [0, 0, kueue_penalty(1), kueue_penalty(2), kueue_penalty(2)]
    assert shown == pytest.approx(expected, rel=1e-3)


def test_a_request_within_its_tenants_nominal_quota_goes_before_those_that_would_borrow() -> None:
    """keps/4136-admission-fair-sharing/README.md, an admission scope at a cohort: a workload that fits its
    ClusterQueue's nominal quota is admitted first; those that stick out are ordered by usage. `owner` has used
    much and has a quota of 4; `guest` has used nothing and no quota. owner's request of 4 goes first; of guest's
    two, one fits what is left of the cohort's 8."""
    tenants: dict[str, Tenant] = {"owner": (4, 1, "lab"), "guest": (0, 1, "lab")}
    cohorts = {"lab": "{gpuQuota: 4, fairSharing: {enabled: true, usageHalfLife: 168h}}"}
    fleet = with_usage(world(ONE_H100_NODE, tenants=tenants, cohorts=cohorts), {"owner": from_kueue(100)})
    queue = [queued("guest-1", "guest", 1, 4), queued("guest-2", "guest", 2, 4), queued("owner-1", "owner", 3, 4)]
    result = run(fleet, queue)
    assert order(result) == ["owner-1", "guest-1", "guest-2"]
    assert [v.allocation_id for v in result.admitted] == ["owner-1", "guest-1"]


def test_each_level_of_the_tree_compares_its_subtrees_usage_over_their_weight() -> None:
    """keps/4136-admission-fair-sharing/README.md: workloads are sorted by a "usage vector built from
    ConsumedResources from TopCohort to LQ". Under org, red's tenants have used 10 GPUs between them (r-idle none),
    blue's b1 4: blue's request goes first, though r-idle used least. With red's weight at 4, red's 10 count 2.5 and
    r-idle's goes first."""
    tenants: dict[str, Tenant] = {"r-idle": (0, 1, "red"), "r-busy": (0, 1, "red"), "b1": (0, 1, "blue")}
    used = {"r-busy": from_kueue(10), "b1": from_kueue(4)}
    queue = [queued("r-idle-1", "r-idle", 1, 8), queued("b1-1", "b1", 2, 8)]
    for red, expected in (
        ("{parentName: org}", ["b1-1", "r-idle-1"]),
        ("{parentName: org, fairSharing: {weight: 4}}", ["r-idle-1", "b1-1"]),
    ):
        cohorts = {
            "org": "{gpuQuota: 8, fairSharing: {enabled: true, usageHalfLife: 168h}}",
            "red": red,
            "blue": "{parentName: org}",
        }
        result = run(with_usage(world(ONE_H100_NODE, tenants=tenants, cohorts=cohorts), used), queue)
        assert order(result) == expected
        assert [v.allocation_id for v in result.admitted] == expected[:1]


def test_preemption_takes_first_from_the_tenant_that_used_more_lately() -> None:
    """test/integration/singlecluster/scheduler/fairsharing/fair_sharing_test.go (AdmissionFairSharing at Cohort
    level), "should preempt a workload from LQ with higher recent usage": the workload of the LocalQueue that used
    more lately is preempted, though its priority is higher. `busy` holds 3 GPUs at priority 10 and has used much;
    `idle` holds 5 at priority 1 and has used little; both borrow. `owner` reclaims 3 of its nominal 4: busy's
    allocation goes. By what each holds now (no half-life), idle, borrowing more, would give back."""
    tenants: dict[str, Tenant] = {"owner": (4, 1, "lab"), "busy": (0, 1, "lab"), "idle": (0, 1, "lab")}
    holds = (("busy", "a01", 3), ("idle", "a01", 5))
    allocations = [Running("held-0", "busy", "a01", 3, 10, 10.0), Running("held-1", "idle", "a01", 5, 1, 20.0)]
    reclaim = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)

    def victims(root: str, used: dict[str, float]) -> tuple[str, ...]:
        fleet = with_usage(world(ONE_H100_NODE, *holds, tenants=tenants, cohorts={"lab": root}), used)
        owner = dataclasses.replace(fleet.tenants["owner"], preemption=reclaim)
        fleet = fleet.with_tenants([*(v for n, v in fleet.tenants.items() if n != "owner"), owner])
        strategy = fleet.regions["r1"].queueing_strategy
        [verdict] = admission_pass(fleet, [queued("new", "owner", 1, 3)], {}, strategy, allocations).verdicts
        assert verdict.code == "preempting" and verdict.nomination is not None, verdict
        return verdict.nomination.victims

    remembering = "{gpuQuota: 4, fairSharing: {enabled: true, usageHalfLife: 168h}}"
    assert victims(remembering, {"busy": from_kueue(20), "idle": from_kueue(1)}) == ("held-0",)
    assert victims("{gpuQuota: 4, fairSharing: {enabled: true}}", {}) == ("held-1",)
