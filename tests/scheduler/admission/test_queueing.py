"""The admission pass over a region's queue (`scheduler.admission.admit`), on small fleets written as an operator
writes them: who is placed next and where, in which position, and why the others still wait.

Every fleet here has one region, `r1`, with one cluster; nodes are named `<prefix><NN>` (e.g. `a01`), and a hold
claims a node's next free slots for a tenant outside the queue.
"""

from __future__ import annotations

import dataclasses

import pytest

from contracts.placement import PlacementRequest
from contracts.vocabulary import QueueingStrategy
from fleet.loader import parse_fleet
from fleet.slot_state import SlotStateDocument
from scheduler.admission import admit as queueing
from scheduler.admission.admit import PassResult, QueuedRequest, admission_pass, ordered, soonest_node
from scheduler.admission.shares import usage_by_product
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement import region
from scheduler.snapshot import Snapshot

BEST_EFFORT = QueueingStrategy.BEST_EFFORT_FIFO
STRICT = QueueingStrategy.STRICT_FIFO

Pool = tuple[str, str, int, int, str]  # name, GPU product, GPUs per node, node count, name prefix
Hold = tuple[str, str, int]  # tenant, node, GPUs (its first slots)
Tenant = tuple[int, float] | tuple[int, float, str]  # gpuQuota, weight, and its cohort when it has one


def _fleet(
    pools: list[Pool], tenants: dict[str, Tenant], strategy: str | None, shape: str, cohorts: dict[str, str]
) -> str:
    region_spec = "{status: available" + (f", queueingStrategy: {strategy}" if strategy else "") + "}"
    docs = [f"kind: Region\nmetadata: {{name: r1}}\nspec: {region_spec}"]
    docs += [
        f"kind: Tenant\nmetadata: {{name: {name}}}\nspec: {{gpuQuota: {spec[0]}, weight: {spec[1]}"
        + (f", cohort: {spec[2]}" if len(spec) > 2 else "")
        + "}"
        for name, spec in tenants.items()
    ]
    docs += [f"kind: Cohort\nmetadata: {{name: {name}}}\nspec: {spec}" for name, spec in cohorts.items()]
    for product in sorted({pool[1] for pool in pools}):
        docs.append(
            f"kind: InferenceClass\nmetadata: {{name: {product.lower()}}}\nspec:\n  devices:\n  - name: gpu\n"
            f"    driver: gpu.nvidia.com\n    attributes: {{productName: {{string: NVIDIA {product}}}}}"
        )
    node_pools = "".join(
        f"  - name: {name}\n    className: {product.lower()}\n    shape: {shape}\n    gpuProduct: {product}\n"
        f"    nodeTemplate: {{count: {count}, namePrefix: {prefix}, gpusPerNode: {gpus}, numaNodes: 2}}\n"
        for name, product, gpus, count, prefix in pools
    )
    docs.append(f"kind: InferenceCluster\nmetadata: {{name: c1}}\nspec:\n  region: r1\n  nodePools:\n{node_pools}")
    return "\n---\n".join(f"apiVersion: berth.dev/v1alpha1\n{doc}" for doc in docs)


def world(
    pools: list[Pool],
    *holds: Hold,
    tenants: dict[str, Tenant] | None = None,
    strategy: str | None = None,
    shape: str = "gpu_slice",
    cohorts: dict[str, str] | None = None,
) -> Snapshot:
    """The fleet with `holds` claimed; tenants are {name: (gpuQuota, weight[, cohort])}, default a and b with 64
    GPUs each; `cohorts` are {name: its Cohort spec, as YAML}."""
    tenants = tenants if tenants is not None else {"a": (64, 1), "b": (64, 1)}
    allocations, taken = [], dict.fromkeys((node for _, node, _ in holds), 0)
    for i, (tenant, node, gpus) in enumerate(holds):
        slots = [f"{node}/{s}" for s in range(taken[node], taken[node] + gpus)]
        allocations.append({"id": f"held-{i}", "tenant": tenant, "slots": slots})
        taken[node] += gpus
    state = SlotStateDocument.model_validate(
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "SlotState",
            "metadata": {"name": "holds"},
            "spec": {"allocations": allocations},
        }
    )
    fleet = parse_fleet([("fleet.yaml", _fleet(pools, tenants, strategy, shape, cohorts or {}))])
    return snapshot_from_fleet(fleet, [state])


def usage(snapshot: Snapshot, *holds: Hold) -> dict[str, dict[str, int]]:
    return usage_by_product(snapshot, holds)


def queued(
    allocation: str,
    tenant: str,
    arrival: int,
    gpus: int,
    *,
    priority: int = 0,
    product: str = "H100",
    shape: str = "gpu_slice",
) -> QueuedRequest:
    request = PlacementRequest(gpu_count=gpus, gpu_product=product, shape=shape, tenant=tenant, region="r1")
    return QueuedRequest(allocation, tenant, "r1", priority, arrival, request)


def run(snapshot: Snapshot, queue: list[QueuedRequest], used: dict[str, dict[str, int]] | None = None) -> PassResult:
    """One pass with the region's own strategy, as the fleet file sets it."""
    return admission_pass(snapshot, queue, used or {}, snapshot.regions["r1"].queueing_strategy)


def placements(result: PassResult) -> list[tuple[str, str]]:
    return [(v.allocation_id, v.node) for v in result.admitted]


ONE_H100_NODE: list[Pool] = [("h100", "H100", 8, 1, "a")]


# Priority.


def test_a_later_request_of_higher_priority_is_admitted_before_an_earlier_one_when_only_one_fits() -> None:
    fleet = world(ONE_H100_NODE, ("b", "a01", 6))  # 2 GPUs free
    queue = [queued("low", "a", 1, 2, priority=0), queued("high", "a", 2, 2, priority=100)]
    result = run(fleet, queue)
    by_id = {v.allocation_id: v for v in result.verdicts}
    assert placements(result) == [("high", "a01")]
    assert (by_id["high"].position, by_id["low"].position) == (1, 2)
    assert by_id["low"].node is None and by_id["low"].code == "insufficient_capacity"
    assert by_id["low"].reason is not None and by_id["low"].reason.startswith("r1: ")

    # The same queue at equal priority: arrival decides.
    same = run(fleet, [queued("low", "a", 1, 2), queued("high", "a", 2, 2)])
    assert placements(same) == [("low", "a01")]


def test_without_fair_sharing_priority_then_arrival_decide_whatever_a_tenant_holds() -> None:
    """Kueue's classic order (fair sharing off, its default): no shares are compared."""
    fleet = world(ONE_H100_NODE, ("a", "a01", 6))  # a holds 6 of 8, b nothing
    queue = [queued("b-1", "b", 1, 2), queued("a-urgent", "a", 2, 2, priority=10)]
    result = run(fleet, queue, usage(fleet, ("a", "a01", 6)))
    assert placements(result) == [("a-urgent", "a01")]
    assert [(v.allocation_id, v.position, v.share) for v in result.verdicts] == [("a-urgent", 1, 0.0), ("b-1", 2, 0.0)]
    later = run(fleet, [queued("a-1", "a", 1, 2), queued("b-1", "b", 2, 2)], usage(fleet, ("a", "a01", 6)))
    assert placements(later) == [("a-1", "a01")]  # a holds far more, but arrived first


def test_a_request_within_its_nominal_quota_goes_before_one_that_would_borrow() -> None:
    """Kueue's scheduler orders the heads of its queues: those that fit their nominal quota first, then priority,
    then arrival (pkg/scheduler, the classic iterator's `Borrows` first)."""
    tenants: dict[str, Tenant] = {"a": (2, 1, "lab"), "b": (6, 1, "lab")}
    fleet = world(ONE_H100_NODE, ("a", "a01", 2), ("b", "a01", 4), tenants=tenants)  # 2 free; a at its quota
    queue = [queued("a-1", "a", 1, 2, priority=5), queued("b-1", "b", 2, 2)]
    result = run(fleet, queue)
    assert placements(result) == [("b-1", "a01")]
    assert [v.allocation_id for v in result.verdicts] == ["b-1", "a-1"]


# Fair sharing (a Cohort with fairSharing enabled): Kueue's dominant resource shares.

LAB = {"lab": "{gpuQuota: 8, fairSharing: {enabled: true}}"}


def test_with_fair_sharing_weighted_tenants_take_turns_as_their_shares_move() -> None:
    """Kueue's fair sharing: of the tenants' next requests, the one whose tenant would have the smaller share of
    what the cohort lends (borrowed / lendable / weight) with it admitted; shares move as the pass places. Weight 2
    against 1 gives a twice the GPUs. With fair sharing off the same queue is plain arrival order."""
    tenants: dict[str, Tenant] = {"a": (0, 2, "lab"), "b": (0, 1, "lab"), "c": (64, 1)}
    queue = [queued(f"a-{i}", "a", i, 1) for i in range(1, 7)] + [queued(f"b-{i}", "b", 6 + i, 1) for i in range(1, 7)]
    fair = world(ONE_H100_NODE, ("c", "a01", 2), tenants=tenants, cohorts=LAB)  # 6 GPUs free
    result = run(fair, queue)
    assert [allocation for allocation, _ in placements(result)] == ["a-1", "a-2", "b-1", "a-3", "a-4", "b-2"]
    assert [v.share for v in result.admitted] == [0.0, 1 / 16, 0.0, 2 / 16, 3 / 16, 1 / 8]
    assert [v.position for v in result.verdicts] == list(range(1, 13))
    assert {v.code for v in result.verdicts[6:]} == {"insufficient_capacity"}

    classic = world(ONE_H100_NODE, ("c", "a01", 2), tenants=tenants, cohorts={"lab": "{gpuQuota: 8}"})
    assert [allocation for allocation, _ in placements(run(classic, queue))] == [f"a-{i}" for i in range(1, 7)]


def test_with_fair_sharing_a_tenant_of_weight_zero_that_borrows_goes_last() -> None:
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "z": (0, 0, "lab")}
    fleet = world(ONE_H100_NODE, tenants=tenants, cohorts=LAB)
    result = run(fleet, [queued("z-1", "z", 1, 1, priority=100), queued("a-1", "a", 2, 1)])
    assert [v.allocation_id for v in result.verdicts] == ["a-1", "z-1"]
    assert result.verdicts[1].share == 0.0  # z borrows nothing yet; after its admission it would (None: last)


def test_with_fair_sharing_sibling_cohorts_are_compared_before_their_tenants() -> None:
    """Kueue's tournament over a hierarchy: at the root the two child cohorts compete by their own shares, so a
    team whose cohort borrows less goes first even if its tenant holds more than the other team's."""
    cohorts = {
        "org": "{gpuQuota: 8, fairSharing: {enabled: true}}",
        "red": "{parentName: org}",
        "blue": "{parentName: org}",
    }
    tenants: dict[str, Tenant] = {"r1": (0, 1, "red"), "r2": (0, 1, "red"), "b1": (0, 1, "blue")}
    holds = (("r1", "a01", 1), ("r2", "a01", 1), ("b1", "a01", 1))  # red's subtree holds 2, blue's 1
    fleet = world(ONE_H100_NODE, *holds, tenants=tenants, cohorts=cohorts)
    result = run(fleet, [queued("r1-next", "r1", 1, 1), queued("b1-next", "b1", 2, 1)])
    assert [v.allocation_id for v in result.verdicts] == ["b1-next", "r1-next"]


# StrictFIFO.


def test_strict_fifo_a_head_that_does_not_fit_blocks_everyone_behind_it() -> None:
    two_nodes: list[Pool] = [("h100", "H100", 8, 2, "a")]
    fleet = world(two_nodes, ("b", "a01", 4), ("b", "a02", 5), strategy="StrictFIFO")  # 4 and 3 free
    assert fleet.regions["r1"].queueing_strategy is STRICT
    queue = [queued("head", "a", 1, 8), queued("small-1", "a", 2, 1), queued("small-2", "a", 3, 2)]
    result = run(fleet, queue)
    assert result.admitted == [] and result.reservations == {}
    head, first, second = result.verdicts
    assert (head.allocation_id, head.position, head.code) == ("head", 1, "insufficient_capacity")
    assert (first.allocation_id, first.position, first.code) == ("small-1", 2, "queued_behind")
    assert (second.allocation_id, second.position, second.code) == ("small-2", 3, "queued_behind")
    assert first.reason is not None and "head" in first.reason and "behind 1 request" in first.reason
    assert second.reason is not None and "head" in second.reason and "behind 2 request" in second.reason

    # BestEffortFIFO on the same fleet sets a01 aside for the head and places both small ones on a02.
    best_effort = admission_pass(fleet, queue, {}, BEST_EFFORT)
    assert placements(best_effort) == [("small-1", "a02"), ("small-2", "a02")]
    assert best_effort.reservations == {"head": "a01"}


def test_strict_fifo_places_in_order_until_the_first_that_does_not_fit() -> None:
    fleet = world(ONE_H100_NODE, ("b", "a01", 4), strategy="StrictFIFO")  # 4 free
    queue = [queued("first", "a", 1, 3), queued("second", "a", 2, 2), queued("third", "a", 3, 1)]
    result = run(fleet, queue)
    assert placements(result) == [("first", "a01")]
    assert [(v.allocation_id, v.code) for v in result.verdicts] == [
        ("first", None),
        ("second", "insufficient_capacity"),
        ("third", "queued_behind"),
    ]
    assert result.verdicts[2].reason is not None and "second" in result.verdicts[2].reason


def test_strict_fifo_a_head_held_back_by_its_quota_blocks_its_own_tenant_only() -> None:
    """Kueue's StrictFIFO blocks a ClusterQueue behind its head whatever holds the head back (its quota
    included); another tenant's queue is not blocked by it."""
    tenants = {"a": (4, 1), "b": (64, 1)}
    holds = (("a", "a01", 3), ("b", "a01", 4))  # a holds 3 of its 4
    fleet = world(ONE_H100_NODE, *holds, tenants=tenants, strategy="StrictFIFO")
    queue = [queued("a-big", "a", 1, 2), queued("a-small", "a", 2, 1), queued("b-1", "b", 3, 1)]
    result = run(fleet, queue, usage(fleet, *holds))
    # b-1 fits its nominal quota and a-big would exceed a's: Kueue's order takes b-1 first.
    assert [v.allocation_id for v in result.verdicts] == ["b-1", "a-big", "a-small"]
    assert placements(result) == [("b-1", "a01")]  # another tenant is not blocked
    verdicts = {v.allocation_id: v for v in result.verdicts}
    assert verdicts["a-big"].code == "quota_exceeded"
    # a-small would fit a's quota (3 + 1 <= 4), but its own head waits: it does not pass it.
    assert verdicts["a-small"].code == "queued_behind"
    assert verdicts["a-small"].reason == (
        "behind a-big, its tenant's request ahead of it, held back by its quota (StrictFIFO)"
    )


# BestEffortFIFO: the head's reservation and backfill around it.

# Two 8-GPU nodes (a01: 2 free, a02: 3 free) and a 4-GPU node (s01: 4 free, the most, but it can never hold 8).
BACKFILL_POOLS: list[Pool] = [("eights", "H100", 8, 2, "a"), ("fours", "H100", 4, 1, "s")]
BACKFILL_HOLDS: tuple[Hold, ...] = (("b", "a01", 6), ("b", "a02", 5))


def test_best_effort_reserves_the_node_that_will_hold_the_head_soonest_and_backfills_elsewhere() -> None:
    fleet = world(BACKFILL_POOLS, *BACKFILL_HOLDS)
    assert fleet.regions["r1"].queueing_strategy is BEST_EFFORT  # the default
    head = queued("head", "a", 1, 8)
    assert soonest_node(fleet, head.request, "r1") == "a02"  # not s01: its hardware could never take 8
    # Without a head, a 3-GPU request goes on a02, the tightest fit.
    assert placements(run(fleet, [queued("three", "a", 2, 3)])) == [("three", "a02")]

    queue = [head, queued("three", "a", 2, 3), queued("two", "a", 3, 2), queued("one", "a", 4, 1)]
    result = run(fleet, queue)
    assert result.reservations == {"head": "a02"}
    verdicts = {v.allocation_id: v for v in result.verdicts}
    assert (verdicts["head"].code, verdicts["head"].node) == ("insufficient_capacity", None)
    assert placements(result) == [("three", "s01"), ("two", "a01"), ("one", "s01")]
    assert all(v.reserved is None for v in result.verdicts if v.allocation_id != "head")


def test_nothing_behind_the_head_goes_on_its_reserved_node_even_when_nothing_else_fits() -> None:
    queue = [queued("head", "a", 1, 8), queued("three", "a", 2, 3)]
    fleet = world(BACKFILL_POOLS, *BACKFILL_HOLDS, ("b", "s01", 2))  # s01: 2 free; only a02 has 3
    result = run(fleet, queue)
    assert result.admitted == [] and result.reservations == {"head": "a02"}
    three = result.verdicts[1]
    assert three.code == "insufficient_capacity" and three.reserved is None
    assert three.reason == (
        "r1: 0/3 nodes can take 3 H100 GPU slices: 2 have fewer than 3 compatible free bundles, "
        "1 is reserved for the request at the head of its queue"
    )


def test_a_request_alike_but_larger_than_one_refused_for_capacity_is_refused_without_being_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: list[int] = []
    real = queueing.cluster.find_candidates

    def find_candidates(snapshot, request, region, **options):  # type: ignore[no-untyped-def]
        tried.append(request.gpu_count)
        return real(snapshot, request, region, **options)

    monkeypatch.setattr(queueing.cluster, "find_candidates", find_candidates)
    fleet = world(BACKFILL_POOLS, *BACKFILL_HOLDS, ("b", "s01", 2))
    queue = [
        queued("head", "a", 1, 8),
        queued("three", "a", 2, 3),  # refused: only the reserved a02 has 3
        queued("four", "a", 3, 4),  # alike (same shape and product) and larger: not tried
        queued("two", "a", 4, 2),  # smaller: tried, and placed
    ]
    result = run(fleet, queue)
    verdicts = {v.allocation_id: v for v in result.verdicts}
    assert placements(result) == [("two", "a01")]
    assert result.reservations == {"head": "a02"}  # one tenant waiting: its head alone holds a node
    assert verdicts["four"].code == "insufficient_capacity" and verdicts["four"].node is None
    assert tried == [8, 3, 2]  # head, three, two; never four


def test_a_tenant_below_its_fair_share_gets_nodes_held_for_more_of_its_requests() -> None:
    # Four empty 8-GPU nodes, half of each taken by `c` (over its share, waiting with nothing) and 4-GPU holes left.
    pools: list[Pool] = [("h100", "H100", 8, 4, "n")]
    fleet = world(pools, *(("c", f"n0{i}", 6) for i in range(1, 5)), tenants={"a": (64, 1), "c": (64, 1)})
    used = {"c": {"h100": 24}}
    queue = [
        queued("a-1", "a", 1, 8),
        queued("a-2", "a", 2, 8),
        queued("a-3", "a", 3, 8),
        queued("c-1", "c", 4, 8),
        queued("c-2", "c", 5, 8),
    ]
    result = run(fleet, queue, used)
    # a (share 0, fair 1/2 of 32 GPUs = 16) gets a node for two of its requests; c, over its share, for its head.
    assert result.admitted == []
    assert sorted(result.reservations) == ["a-1", "a-2", "c-1"]
    assert len(set(result.reservations.values())) == 3


def test_baremetal_requests_of_another_size_are_not_alike() -> None:
    # Bare metal takes a whole host of exactly its size: a 4-GPU host being busy says nothing of a free 8-GPU host.
    pools: list[Pool] = [("big", "H100", 8, 1, "m"), ("small", "H100", 4, 1, "q")]
    fleet = world(pools, ("b", "q01", 1), shape="baremetal")
    queue = [
        queued("four", "a", 1, 4, shape="baremetal"),
        queued("four-too", "a", 2, 4, shape="baremetal"),
        queued("eight", "a", 3, 8, shape="baremetal"),
    ]
    result = run(fleet, queue)
    assert placements(result) == [("eight", "m01")]
    assert [v.code for v in result.verdicts[:2]] == ["insufficient_capacity"] * 2
    assert result.reservations == {"four": "q01"}


# Quota.


def test_a_tenant_at_its_quota_waits_with_the_quota_reason_and_others_go_on() -> None:
    tenants = {"a": (4, 1), "b": (64, 1)}
    fleet = world(ONE_H100_NODE, ("a", "a01", 4), tenants=tenants)  # a at its quota of 4; 4 GPUs free
    held = usage(fleet, ("a", "a01", 4))
    queue = [queued("a-1", "a", 1, 1, priority=5), queued("b-1", "b", 2, 2)]
    result = run(fleet, queue, held)
    assert placements(result) == [("b-1", "a01")]
    waiting = result.verdicts[1]  # after b-1, which fits its nominal quota
    assert (waiting.allocation_id, waiting.code, waiting.reserved) == ("a-1", "quota_exceeded", None)
    assert (
        waiting.reason == "quota: tenant a would exceed its GPU quota: 4 active + 0 in flight + 1 requested > quota 4"
    )


def test_admissions_in_the_pass_count_against_the_quota() -> None:
    fleet = world(ONE_H100_NODE, tenants={"a": (6, 1)})  # 8 GPUs free, a may use 6
    result = run(fleet, [queued("a-1", "a", 1, 4), queued("a-2", "a", 2, 4)])
    assert placements(result) == [("a-1", "a01")]
    second = result.verdicts[1]
    assert second.code == "quota_exceeded"
    assert second.reason == "quota: tenant a would exceed its GPU quota: 0 active + 4 in flight + 4 requested > quota 6"


# Positions as shown.


def test_ordered_gives_positions_by_quota_then_priority_then_arrival() -> None:
    tenants: dict[str, Tenant] = {"a": (64, 1), "b": (64, 2), "c": (1, 1)}
    fleet = world(ONE_H100_NODE, ("a", "a01", 4), ("b", "a01", 4), tenants=tenants)
    held = usage(fleet, ("a", "a01", 4), ("b", "a01", 4))
    queue = [
        queued("a-early", "a", 1, 1),
        queued("b-early", "b", 2, 1),
        queued("c-late", "c", 3, 2),  # more than c's quota of 1
        queued("a-urgent", "a", 4, 1, priority=10),
        queued("c-later", "c", 5, 1),
        queued("b-low", "b", 6, 1, priority=-1),
    ]
    shown = ordered(queue, fleet, held)
    assert [entry.allocation_id for entry, _ in shown] == [
        "a-urgent",
        "a-early",
        "b-early",
        "b-low",
        "c-late",
        "c-later",
    ]
    assert {standing.share for _, standing in shown} == {0.0}
    assert ordered(list(reversed(queue)), fleet, held) == shown


# Where a request refused by its quota waits (scheduler.placement.region.waiting_region).


def test_a_request_over_its_quota_waits_in_its_region_unless_it_could_never_fit_in_it() -> None:
    fleet = world(ONE_H100_NODE, ("a", "a01", 4), tenants={"a": (4, 1)})
    assert region.waiting_region(fleet, queued("more", "a", 1, 2).request) == "r1"  # waits for a's own GPUs
    assert region.waiting_region(fleet, queued("huge", "a", 1, 5).request) is None  # never within a quota of 4


def test_a_cohort_member_waits_for_lent_quota_even_while_the_cohort_lends_none() -> None:
    fleet = world(ONE_H100_NODE, ("a", "a01", 2), ("b", "a01", 4), tenants={"a": (2, 1), "b": (4, 1)})
    members = [dataclasses.replace(t, cohort="research") for t in fleet.tenants.values()]
    fleet = fleet.with_tenants(members)
    # a uses its 2, b all of its 4: nothing to lend now, but b could lend up to 4 once idle.
    assert region.waiting_region(fleet, queued("borrow", "a", 1, 4).request) == "r1"
    assert region.waiting_region(fleet, queued("beyond", "a", 1, 7).request) is None
