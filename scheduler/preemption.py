"""Preemption (issue 26): which running allocations a queued request may displace, and which it does.

A queued request that does not fit may take GPUs back from running allocations when policy allows, in Kueue's terms
(its `preemption` of a ClusterQueue, here a Tenant's) and with kube-scheduler's choice of node:

    never      a request of a PriorityClass with `preemptionPolicy: Never` (Kubernetes) displaces nobody, and an
               allocation of a `nonPreemptible` class (KAI-Scheduler) is never displaced;
    eligible   a running allocation is a candidate when one rule lets the request displace it:
               - it is of a `preemptible` (spot) PriorityClass and the request is not: anyone may displace it;
               - it is the request's own tenant's, and `withinTenant` allows it (`LowerPriority`: a lower priority;
                 `LowerOrNewerEqualPriority`: also an equal one created after the request: Kueue compares the two
                 workloads' creation times);
               - it is another tenant's of the request's cohort, that tenant borrows now (uses more than its
                 nominal quota), and `reclaimWithinCohort` allows it
                 (`LowerPriority` or `Any`); when the request would still borrow once admitted, only if
                 `borrowWithinCohort` is `LowerPriority` and the allocation's priority is below the request's and at
                 most `maxPriorityThreshold`;
               No shares are compared: Kueue's classic preemption (fair sharing off, its default) decides by these
               three policies alone, so a lender reclaims from a borrower whatever either holds.
    order      allocations of other tenants of the cohort that borrow now first (their tenant's state at the
               decision, as Kueue orders by its ClusterQueues' state), then lower priority, then the most recently
               started (Kueue's candidate order).
    quota      (the tenant or its cohort has no quota left, the fleet has room) candidates in order are taken until
               the request fits its quota, then every victim no longer needed is given back, the last taken first;
               if all of them would not make it fit, nothing is preempted.
    capacity   (the quota allows it, no node has room) only nodes where preempting frees a placement of the request's
               shape are considered, each with the same order and minimisation over its own allocations; of those,
               the node whose most important victim has the lowest priority, then the fewest victims, then the most
               recently started victims (kube-scheduler's order).

Pure: the caller gives the snapshot (usage applied), the running allocations and the time each started.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet.vocabulary import BorrowWithinCohort, ReclaimWithinCohort, WithinTenant
from scheduler import cluster, quota
from scheduler.reasons import Reason
from scheduler.request import PlacementRequest
from scheduler.snapshot import Snapshot
from scheduler.views import SlotState, TenantView


@dataclass(frozen=True)
class Running:
    """An active allocation as preemption weighs it."""

    allocation_id: str
    tenant: str
    node: str
    gpus: int
    priority: int
    started: float  # when it became active (seconds since the epoch): the newest goes first among equals
    borrowed: int = 0  # its own part of what its tenant borrowed when it was claimed (shown; order asks the tenant)
    preemptible: bool = False  # of a `preemptible` PriorityClass: anyone not preemptible may displace it
    created: float | None = None  # when it was requested (None: its start): `LowerOrNewerEqualPriority` compares it
    non_preemptible: bool = False  # of a `nonPreemptible` PriorityClass: never displaced

    @property
    def requested(self) -> float:
        return self.created if self.created is not None else self.started


@dataclass(frozen=True)
class Preemptor:
    allocation_id: str
    tenant: str
    priority: int
    created: float  # when it was requested: `LowerOrNewerEqualPriority` displaces equal priorities requested later
    request: PlacementRequest
    preemptible: bool = False
    never_preempts: bool = False  # of a class with `preemptionPolicy: Never`


@dataclass(frozen=True)
class Preemption:
    """The victims, the node freed for the preemptor (the capacity case; None when quota decided), and why each."""

    case: str  # "quota" or "capacity"
    node: str | None
    victims: tuple[Running, ...]
    reasons: Mapping[str, str]  # victim -> the rule that lets the preemptor displace it


def plan_preemption(
    snapshot: Snapshot, region: str, preemptor: Preemptor, running: Iterable[Running], refused: str
) -> Preemption | str:
    """The preemption that places `preemptor`, refused now with code `refused` (`quota_exceeded` or
    `insufficient_capacity`), or why there is none."""
    if preemptor.never_preempts:
        return "its PriorityClass never preempts (preemptionPolicy: Never)"
    running = [r for r in running if r.allocation_id != preemptor.allocation_id]
    if refused == Reason.QUOTA_EXCEEDED:
        return _for_quota(snapshot, region, preemptor, running)
    if refused == Reason.INSUFFICIENT_CAPACITY:
        return _for_capacity(snapshot, region, preemptor, running)
    return f"preemption does not help a request refused with {refused}"


# -- who may be displaced, and in which order -------------------------------------------------------------------------


# Kueue's names for the rules (the `Preempted` condition's reason on a preempted Workload), shown beside Berth's words.
IN_CLUSTER_QUEUE = "InClusterQueue"  # withinTenant
IN_COHORT_RECLAMATION = "InCohortReclamation"  # reclaimWithinCohort
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"  # borrowWithinCohort


def kueue_named(words: str, rule: str) -> str:
    return f"{words} (Kueue: {rule})"


def eligibility(snapshot: Snapshot, preemptor: Preemptor, victim: Running) -> str | None:
    """The rule that lets the preemptor displace `victim`, in words (and Kueue's name for it), or None."""
    if victim.non_preemptible:
        return None  # KAI: a non-preemptible workload is never a victim
    if victim.preemptible and not preemptor.preemptible:
        return "of a preemptible PriorityClass"
    tenants = snapshot.tenants
    mine = tenants.get(preemptor.tenant)
    if mine is None:
        return None
    policy = mine.preemption
    if victim.tenant == preemptor.tenant:
        lower = victim.priority < preemptor.priority
        if policy.within_tenant is WithinTenant.LOWER_PRIORITY and lower:
            words = f"withinTenant {policy.within_tenant}: priority {victim.priority} < {preemptor.priority}"
            return kueue_named(words, IN_CLUSTER_QUEUE)
        newer = victim.priority == preemptor.priority and victim.requested > preemptor.created
        if policy.within_tenant is WithinTenant.LOWER_OR_NEWER_EQUAL_PRIORITY and (lower or newer):
            words = f"withinTenant {policy.within_tenant}: priority {victim.priority}, requested after this request"
            return kueue_named(words, IN_CLUSTER_QUEUE)
        return None
    theirs = tenants.get(victim.tenant)
    if mine.cohort is None or theirs is None or theirs.cohort != mine.cohort or not borrows(theirs):
        return None
    if policy.reclaim_within_cohort is ReclaimWithinCohort.NEVER:
        return None
    if policy.reclaim_within_cohort is ReclaimWithinCohort.LOWER_PRIORITY and victim.priority >= preemptor.priority:
        return None
    rule = IN_COHORT_RECLAMATION
    if _would_borrow(snapshot, preemptor):
        rule = IN_COHORT_RECLAIM_WHILE_BORROWING
        threshold = policy.max_priority_threshold
        if policy.borrow_within_cohort is not BorrowWithinCohort.LOWER_PRIORITY:
            return None
        if victim.priority >= preemptor.priority or (threshold is not None and victim.priority > threshold):
            return None
    # No tenant is named: the words reach the preemptor's tenant too (explain, the victim's notice is the victim's).
    words = f"reclaimWithinCohort {policy.reclaim_within_cohort}: its tenant borrows in cohort {mine.cohort}"
    return kueue_named(words, rule)


def candidate_order(snapshot: Snapshot, preemptor: Preemptor, victim: Running) -> tuple[int, int, float]:
    """Kueue's order: allocations of other tenants that borrow now first, then lower priority, then the newest."""
    theirs = snapshot.tenants.get(victim.tenant)
    other_borrower = victim.tenant != preemptor.tenant and theirs is not None and borrows(theirs)
    return (0 if other_borrower else 1, victim.priority, -victim.started)


def borrows(tenant: TenantView) -> bool:
    """Whether the tenant uses more than its nominal quota now: Kueue's ClusterQueue that is borrowing."""
    return quota.used(tenant) > tenant.gpu_quota


def _would_borrow(snapshot: Snapshot, preemptor: Preemptor) -> bool:
    tenant = snapshot.tenants[preemptor.tenant]
    return quota.used(tenant) + preemptor.request.gpu_count > tenant.gpu_quota


# -- the two cases ----------------------------------------------------------------------------------------------------


def _for_quota(snapshot: Snapshot, region: str, preemptor: Preemptor, running: list[Running]) -> Preemption | str:
    candidates = _candidates(snapshot, preemptor, running)
    if not candidates:
        return "no running allocation may be displaced for its quota (its tenant's preemption policy)"

    def fits(victims: Sequence[Running]) -> bool:
        freed = without(snapshot, victims)
        tenant = freed.tenants[preemptor.tenant]
        return quota.decide(tenant, preemptor.request.gpu_count, freed.tenants.values(), cohorts=freed.cohorts).fits

    victims = _take_and_minimise(candidates, fits)
    if victims is None:
        return "displacing every allocation its policy allows would still not fit its quota"
    if cluster.find_candidates(without(snapshot, victims), preemptor.request, region).refusal is not None:
        return "its quota would fit, but no node would have room: preempting for the quota alone would not place it"
    return Preemption("quota", None, tuple(victims), {v.allocation_id: candidates[v] for v in victims})


def _for_capacity(snapshot: Snapshot, region: str, preemptor: Preemptor, running: list[Running]) -> Preemption | str:
    request = preemptor.request
    by_node: dict[str, list[Running]] = {}
    for allocation in running:
        by_node.setdefault(allocation.node, []).append(allocation)
    best: tuple[tuple[int, int, float], str, list[Running], dict[Running, str]] | None = None
    for node in cluster.nodes_that_could_hold(snapshot, request, region):
        name = node.name
        candidates = _candidates(snapshot, preemptor, by_node.get(name, []))
        if not candidates:
            continue
        pinned = request.model_copy(update={"nodes": frozenset({name}), "gpus": frozenset()})

        def fits(victims: Sequence[Running], pinned: PlacementRequest = pinned) -> bool:
            return not cluster.find_candidates(without(snapshot, victims), pinned, region).refusal

        victims = _take_and_minimise(candidates, fits)
        if victims is None:
            continue
        key = (max(v.priority for v in victims), len(victims), -max(v.started for v in victims))
        if best is None or (key, name) < (best[0], best[1]):
            best = (key, name, victims, candidates)
    if best is None:
        return "no node would have room for it even with every allocation its policy allows displaced"
    _, name, victims, candidates = best
    return Preemption("capacity", name, tuple(victims), {v.allocation_id: candidates[v] for v in victims})


def _candidates(snapshot: Snapshot, preemptor: Preemptor, running: Iterable[Running]) -> dict[Running, str]:
    """The allocations the preemptor may displace, in the order they are taken, each with its rule."""
    eligible = [(r, why) for r in running if (why := eligibility(snapshot, preemptor, r)) is not None]
    eligible.sort(key=lambda pair: candidate_order(snapshot, preemptor, pair[0]))
    return dict(eligible)


def _take_and_minimise(
    candidates: Mapping[Running, str], fits: Callable[[Sequence[Running]], bool]
) -> list[Running] | None:
    """Take candidates in order until the request fits; then give back every victim it fits without, the last
    taken first. None when all of them would not do."""
    taken: list[Running] = []
    for candidate in candidates:
        taken.append(candidate)
        if fits(taken):
            break
    else:
        return None
    for victim in reversed(list(taken)):
        rest = [v for v in taken if v is not victim]
        if fits(rest):
            taken = rest
    return taken


def without(snapshot: Snapshot, victims: Sequence[Running]) -> Snapshot:
    """The snapshot as it would be once `victims` are released: their slots free, their GPUs off their tenants."""
    if not victims:
        return snapshot
    gone = {v.allocation_id for v in victims}
    nodes = []
    for name in {v.node for v in victims}:
        node = snapshot.nodes[name]
        slots = tuple(
            dataclasses.replace(s, state=SlotState.FREE, holder=None) if s.holder in gone else s for s in node.slots
        )
        nodes.append(dataclasses.replace(node, slots=slots))
    freed_by: dict[str, list[Running]] = {}
    for victim in victims:
        freed_by.setdefault(victim.tenant, []).append(victim)
    tenants = []
    for name, theirs in freed_by.items():
        view = snapshot.tenants.get(name)
        if view is None:
            continue
        held = list(view.held)
        for victim in theirs:
            place = next((p for p in snapshot.pools_of(victim.node) if p.gpu_product), None)
            if place is not None:
                held = _less(held, place.gpu_product or "", place.region, victim.gpus)
        tenants.append(
            dataclasses.replace(
                view, active_gpus=max(0, view.active_gpus - sum(v.gpus for v in theirs)), held=tuple(held)
            )  # fmt: skip
        )
    return snapshot.with_nodes(nodes).with_tenants({**snapshot.tenants, **{t.name: t for t in tenants}}.values())


def _less(held: list[tuple[str, str, int]], product: str, region: str, gpus: int) -> list[tuple[str, str, int]]:
    result = []
    for p, r, n in held:
        if gpus and p.casefold() == product.casefold() and r == region:
            taken = min(n, gpus)
            n, gpus = n - taken, gpus - taken
        if n:
            result.append((p, r, n))
    return result


__all__ = ["Preemption", "Preemptor", "Running", "plan_preemption", "without"]
