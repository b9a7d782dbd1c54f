"""Preemption: which running allocations a queued request may displace, and which it does.

A queued request that does not fit may take GPUs back from running allocations when policy allows, in Kueue's terms
(its `preemption` of a ClusterQueue, here a Tenant's) and with kube-scheduler's choice of node:

    never      a request of a PriorityClass with `preemptionPolicy: Never` (Kubernetes) displaces nobody, and an
               allocation of a `nonPreemptible` class (KAI-Scheduler) is never displaced;
    eligible   a running allocation is a candidate when one rule lets the request displace it:
               - it is of a `preemptible` (spot) PriorityClass and the request is not: anyone may displace it;
               - it is the request's own tenant's, and `withinTenant` allows it (`LowerPriority`: a lower priority;
                 `LowerOrNewerEqualPriority`: also an equal one created after the request: Kueue compares the two
                 workloads' creation times);
               - it is another tenant's of the request's cohort tree, that tenant borrows now (uses more than its
                 nominal quota) and so does every cohort between it and the lowest cohort it shares with the
                 request's tenant (Kueue's hierarchical reclaim), and `reclaimWithinCohort` allows it (`LowerPriority`
                 or `Any`). When the request fits below that shared cohort (its tenant's nominal quota, or a subtree
                 on its side) it reclaims without borrowing; otherwise only if `borrowWithinCohort` is
                 `LowerPriority` and the allocation's priority is below the request's and at most
                 `maxPriorityThreshold`;
               Without fair sharing no shares are compared: Kueue's classic preemption decides by these three
               policies alone, so a lender reclaims from a borrower whatever either holds.
    fair       where the tree shares fairly (`scheduler.quota.fair_sharing`), `borrowWithinCohort` does not apply and the
               shares decide instead, by the strategies the tree's root lists (Kueue's `preemptionStrategies`,
               default both): the borrowing tenant with the largest share is taken from first; its allocation goes
               when the request fits its own nominal quota (named InCohortReclamation, as Kueue names it), or when
               the first strategy lets it (named InCohortFairSharing): the request's side's share with it admitted
               is at most the victim's side's share once the allocation is gone (`LessThanOrEqualToFinalShare`),
               or below that side's share as it is (`LessThanInitialShare`), the two sides being the children of
               their lowest common cohort. With a second strategy, what the first left is then taken, one
               allocation per tenant, largest share first, where `LessThanInitialShare` lets it; only that phase's
               own victims limit it.
    order      other tenants' allocations first (those reclaimed without borrowing before the rest), then lower
               priority, then the most recently started (Kueue's candidate order); each is re-checked as the ones
               before it are taken, and passed over once its tenant no longer borrows.
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

from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from contracts.vocabulary import (
    DEFAULT_FAIR_SHARING_STRATEGIES,
    BorrowWithinCohort,
    FairSharingStrategy,
    ReclaimWithinCohort,
    SlotState,
    WithinTenant,
)
from scheduler.placement import cluster
from scheduler.quota import accounts as quota
from scheduler.quota import fair_sharing
from scheduler.quota.cohorts import root_of
from scheduler.snapshot import Snapshot
from scheduler.views import PreemptionPolicy, TenantView

Node = tuple[str, str]
NO_POLICY = PreemptionPolicy()


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
    mine = snapshot.tenants.get(preemptor.tenant)
    if (mine is None or mine.preemption == NO_POLICY) and (
        preemptor.preemptible or not any(r.preemptible for r in running)
    ):
        return "its tenant's preemption policy displaces nothing, and no preemptible allocation runs"
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


IN_COHORT_FAIR_SHARING = "InCohortFairSharing"  # fair sharing's strategies


class Judge:
    """Who the preemptor may displace on one snapshot: its tenant's cohort tree, and at each cohort above it
    whether the preemptor fits below that cohort (Kueue's hierarchical reclaim)."""

    def __init__(self, snapshot: Snapshot, preemptor: Preemptor) -> None:
        self.snapshot, self.preemptor = snapshot, preemptor
        self.mine = snapshot.tenants.get(preemptor.tenant)
        self.tree = quota.snapshot_tree(snapshot, self.mine) if self.mine else None
        self.fair = self.mine is not None and fair_sharing.shares_fairly(self.mine, snapshot.cohorts)
        self.within_below = self._within_below()
        self._reclaimable: dict[str, Node | None] = {}
        # Its request fits its tenant's nominal quota: under fair sharing it then reclaims whatever the shares
        # say (Kueue's preemptor within nominal), and the rule is named reclamation, not fair sharing.
        self.within_nominal = self.mine is not None and (
            quota.used(self.mine) + preemptor.request.gpu_count <= self.mine.gpu_quota
        )

    @property
    def strategies(self) -> tuple[FairSharingStrategy, ...]:
        """The fair-sharing strategies its tree's root lists, in the order they are tried (Kueue's default pair
        where the root names none)."""
        root = root_of(self.mine.cohort, self.snapshot.cohorts) if self.mine is not None else None
        view = self.snapshot.cohorts.get(root) if root is not None else None
        return view.preemption_strategies if view is not None else DEFAULT_FAIR_SHARING_STRATEGIES

    def _within_below(self) -> dict[Node, bool]:
        """cohort above the preemptor -> whether its request fits the quota of a node strictly below that cohort
        on its own path (its tenant's nominal quota, or a cohort's subtree quota): reclaiming from a subtree beside
        that node is then not borrowing (Kueue's hierarchical candidates, where `borrowWithinCohort` does not
        apply)."""
        if self.mine is None or self.tree is None:
            return {}
        node: Node = ("tenant", self.mine.name)
        gpus = self.preemptor.request.gpu_count
        fits = quota.used(self.mine) + gpus <= self.mine.gpu_quota
        left = max(0, gpus - max(0, self.tree.guaranteed(node) - self.tree.usage(node)))
        result: dict[Node, bool] = {}
        for cohort in self.tree.ancestors(node):
            result[cohort] = fits
            fits = fits or self.tree.subtree_quota(cohort) >= self.tree.usage(cohort) + left
            left = max(0, left - max(0, self.tree.guaranteed(cohort) - self.tree.usage(cohort)))
        return result

    def reclaimable(self, tenant: TenantView) -> Node | None:
        if tenant.name not in self._reclaimable:
            self._reclaimable[tenant.name] = self._meeting_if_borrowing(tenant)
        return self._reclaimable[tenant.name]

    def _meeting_if_borrowing(self, tenant: TenantView) -> Node | None:
        """The lowest cohort above both the preemptor and `tenant` when `tenant` borrows and so does every cohort
        between it and there (its subtree draws beyond its own quota): Kueue's condition for taking quota back
        from another queue of the tree. None when it may not be reclaimed from."""
        if self.mine is None or self.tree is None or tenant.cohort is None:
            return None
        them: Node = ("tenant", tenant.name)
        if them not in self.tree.parent or not self.tree.borrowing(them):
            return None
        meeting = self.tree.lowest_common_ancestor(("tenant", self.mine.name), them)
        if meeting is None:
            return None
        for cohort in self.tree.ancestors(them):
            if cohort == meeting:
                return meeting
            if not self.tree.borrowing(cohort):
                return None
        return None

    def eligibility(self, victim: Running) -> str | None:
        """The rule that lets the preemptor displace `victim`, in words (and Kueue's name for it), or None."""
        preemptor = self.preemptor
        if victim.non_preemptible:
            return None  # KAI: a non-preemptible workload is never a victim
        if victim.preemptible and not preemptor.preemptible:
            return "of a preemptible PriorityClass"
        mine = self.mine
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
        theirs = self.snapshot.tenants.get(victim.tenant)
        meeting = self.reclaimable(theirs) if theirs is not None else None
        if meeting is None or policy.reclaim_within_cohort is ReclaimWithinCohort.NEVER:
            return None
        if policy.reclaim_within_cohort is ReclaimWithinCohort.LOWER_PRIORITY and victim.priority >= preemptor.priority:
            return None
        # No tenant is named: the words reach the preemptor's tenant too (explain, the victim's notice is the victim's).
        words = f"reclaimWithinCohort {policy.reclaim_within_cohort}: its tenant borrows in cohort {meeting[1]}"
        if self.fair:  # borrowWithinCohort does not apply under fair sharing; the shares decide (`_fair_take`)
            return kueue_named(words, IN_COHORT_RECLAMATION if self.within_nominal else IN_COHORT_FAIR_SHARING)
        if self.within_below.get(meeting, False):
            return kueue_named(words, IN_COHORT_RECLAMATION)
        threshold = policy.max_priority_threshold
        if policy.borrow_within_cohort is not BorrowWithinCohort.LOWER_PRIORITY:
            return None
        if victim.priority >= preemptor.priority or (threshold is not None and victim.priority > threshold):
            return None
        return kueue_named(words, IN_COHORT_RECLAIM_WHILE_BORROWING)

    def order(self, victim: Running) -> tuple[int, int, float]:
        """Kueue's candidate order: other tenants' allocations first (those reclaimed without borrowing, then the
        rest), then lower priority, then the newest."""
        if victim.tenant == self.preemptor.tenant:
            group = 2
        else:
            theirs = self.snapshot.tenants.get(victim.tenant)
            meeting = self.reclaimable(theirs) if theirs is not None else None
            group = 0 if meeting is not None and self.within_below.get(meeting, False) else 1
        return (group, victim.priority, -victim.started)

    def still_eligible(self, victim: Running) -> bool:
        """Whether a candidate may still be taken on this snapshot (earlier victims gone): its own tenant's always;
        another's while its tenant, and its subtree up to the meeting cohort, still borrow (Kueue re-checks each
        candidate as it takes them)."""
        if victim.tenant == self.preemptor.tenant or (victim.preemptible and not self.preemptor.preemptible):
            return True
        theirs = self.snapshot.tenants.get(victim.tenant)
        return theirs is not None and self.reclaimable(theirs) is not None


# -- the two cases ----------------------------------------------------------------------------------------------------


def _for_quota(snapshot: Snapshot, region: str, preemptor: Preemptor, running: list[Running]) -> Preemption | str:
    candidates = _candidates(snapshot, preemptor, running)
    if not candidates:
        return "no running allocation may be displaced for its quota (its tenant's preemption policy)"

    def fits(victims: Sequence[Running]) -> bool:
        """The quota the request was refused by, judged as its admission judges it: a non-preemptible request
        within its tenant's nominal quota alone, however much the cohort could lend."""
        freed = without(snapshot, victims)
        tenant = freed.tenants[preemptor.tenant]
        return quota.decide(
            tenant,
            preemptor.request.gpu_count,
            freed.tenants.values(),
            within_nominal=preemptor.request.within_nominal,
            cohorts=freed.cohorts,
        ).fits

    if fits([]):  # never a preemption that takes nothing: the refusal came from elsewhere
        return "its quota already has room: displacing allocations would not change what holds it back"
    chosen = _take_and_minimise(snapshot, preemptor, candidates, fits)
    if chosen is None:
        return "displacing every allocation its policy allows would still not fit its quota"
    victims, reasons = chosen
    if cluster.find_candidates(without(snapshot, victims), preemptor.request, region).refusal is not None:
        return "its quota would fit, but no node would have room: preempting for the quota alone would not place it"
    return Preemption("quota", None, tuple(victims), reasons)


def _for_capacity(snapshot: Snapshot, region: str, preemptor: Preemptor, running: list[Running]) -> Preemption | str:
    request = preemptor.request
    by_node: dict[str, dict[Running, str]] = {}
    for allocation, why in _candidates(snapshot, preemptor, running).items():  # in order, so each node's are too
        by_node.setdefault(allocation.node, {})[allocation] = why
    best: tuple[tuple[int, int, float], str, list[Running], dict[str, str]] | None = None
    for node in cluster.nodes_that_could_hold(snapshot, request, region) if by_node else ():
        name = node.name
        candidates = by_node.get(name)
        if not candidates:
            continue
        pinned = request.model_copy(update={"nodes": frozenset({name}), "gpus": frozenset()})

        def fits(victims: Sequence[Running], pinned: PlacementRequest = pinned) -> bool:
            return not cluster.find_candidates(without(snapshot, victims), pinned, region).refusal

        if fits([]):  # it has room already (held for another request, say): nothing to displace here
            continue
        chosen = _take_and_minimise(snapshot, preemptor, candidates, fits)
        if chosen is None:
            continue
        victims, reasons = chosen
        key = (max(v.priority for v in victims), len(victims), -max(v.started for v in victims))
        if best is None or (key, name) < (best[0], best[1]):
            best = (key, name, victims, reasons)
    if best is None:
        return "no node would have room for it even with every allocation its policy allows displaced"
    _, name, victims, reasons = best
    return Preemption("capacity", name, tuple(victims), reasons)


def _candidates(snapshot: Snapshot, preemptor: Preemptor, running: Iterable[Running]) -> dict[Running, str]:
    """The allocations the preemptor may displace, in the order they are taken, each with its rule."""
    judge = Judge(snapshot, preemptor)
    eligible = [(r, why) for r in running if (why := judge.eligibility(r)) is not None]
    eligible.sort(key=lambda pair: judge.order(pair[0]))
    return dict(eligible)


def _take_and_minimise(
    snapshot: Snapshot,
    preemptor: Preemptor,
    candidates: Mapping[Running, str],
    fits: Callable[[Sequence[Running]], bool],
) -> tuple[list[Running], dict[str, str]] | None:
    """The victims and why each: taken until the request fits, then every victim it fits without given back, the
    last taken first. None when all of them would not do."""
    if Judge(snapshot, preemptor).fair:
        taken = _fair_take(snapshot, preemptor, candidates, fits)
    else:
        taken = _classic_take(snapshot, preemptor, candidates, fits)
    if taken is None:
        return None
    victims = list(taken)
    for victim in reversed(list(victims)):
        rest = [v for v in victims if v is not victim]
        if fits(rest):
            victims = rest
    return victims, {v.allocation_id: taken[v] for v in victims}


def _classic_take(
    snapshot: Snapshot,
    preemptor: Preemptor,
    candidates: Mapping[Running, str],
    fits: Callable[[Sequence[Running]], bool],
) -> dict[Running, str] | None:
    """Kueue's classic preemption: candidates in order, each taken only while it is still eligible once the ones
    before it are gone, until the request fits."""
    taken: dict[Running, str] = {}
    for candidate, why in candidates.items():
        if taken and not Judge(without(snapshot, list(taken)), preemptor).still_eligible(candidate):
            continue
        taken[candidate] = why
        if fits(list(taken)):
            return taken
    return None


def _fair_take(
    snapshot: Snapshot,
    preemptor: Preemptor,
    candidates: Mapping[Running, str],
    fits: Callable[[Sequence[Running]], bool],
) -> dict[Running, str] | None:
    """Kueue's fair-sharing preemption, in its tree's strategies (`Judge.strategies`).

    First phase: take from the tenant with the largest share first (its own tenant's allocations before any);
    another tenant's allocation is taken when the preemptor's request fits its own nominal quota, or when the first
    strategy lets it, comparing the preemptor's side with its request admitted against the victim's side, the two
    children of their lowest common cohort; one that does not pass is kept for the second phase. Second phase (a
    second strategy listed, which is LessThanInitialShare): of what the first left, one allocation per tenant, the
    largest share first, while the preemptor's side is below the victim's side as it is. Only the second phase's
    own victims limit it: a tenant that lost one to the first phase may lose one more there (Kueue's
    `runSecondFsStrategy`)."""
    judge = Judge(snapshot, preemptor)
    first, *rest = judge.strategies
    taken: dict[Running, str] = {}
    left = dict(candidates)
    retry: list[Running] = []
    while left:
        target = _largest_share(without(snapshot, list(taken)), preemptor, left)
        if target is None:
            break
        for victim in [c for c in left if c.tenant == target]:
            del left[victim]
            if not _reclaims_freely(judge, preemptor, victim) and not _passes(
                first, snapshot, preemptor, list(taken), victim
            ):
                retry.append(victim)
                continue
            taken[victim] = candidates[victim]
            if fits(list(taken)):
                return taken
            break  # choose the target again on what is left
    if not rest:
        return None
    while retry:  # LessThanInitialShare, one allocation per tenant
        state = without(snapshot, list(taken))
        target = _largest_share(state, preemptor, dict.fromkeys(retry, ""))
        if target is None:
            break
        victim = next(v for v in retry if v.tenant == target)
        retry = [v for v in retry if v.tenant != target]
        if not Judge(state, preemptor).still_eligible(victim):
            continue
        if _passes(FairSharingStrategy.LESS_THAN_INITIAL_SHARE, snapshot, preemptor, list(taken), victim):
            taken[victim] = candidates[victim]
            if fits(list(taken)):
                return taken
    return None


def _reclaims_freely(judge: Judge, preemptor: Preemptor, victim: Running) -> bool:
    """Taken whatever the shares: its own tenant's, a preemptible one, or any when the preemptor's request fits its
    tenant's nominal quota (Kueue: a preemptor within nominal reclaims what was lent)."""
    return victim.tenant == preemptor.tenant or victim.preemptible or judge.within_nominal


def _passes(
    strategy: FairSharingStrategy, snapshot: Snapshot, preemptor: Preemptor, taken: list[Running], victim: Running
) -> bool:
    """Whether `strategy` lets the preemptor take `victim`, the allocations `taken` already gone: the preemptor's
    side's share with its request admitted, at most the victim's side's share once it is gone
    (LessThanOrEqualToFinalShare), or below that side's share as it is (LessThanInitialShare)."""
    if strategy is FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE:
        mine, theirs = _sibling_shares(without(snapshot, [*taken, victim]), preemptor, victim)
        return mine <= theirs
    mine, theirs = _sibling_shares(without(snapshot, taken), preemptor, victim)
    return mine < theirs


def _largest_share(snapshot: Snapshot, preemptor: Preemptor, left: Mapping[Running, str]) -> str | None:
    """The tenant to take from next: its own tenant's allocations first, then the borrowing tenant whose share is
    largest (Kueue walks its tree from the root choosing the largest share; here each tenant's path of shares from
    the root down, compared in order, stands for that walk)."""
    tenants = {c.tenant for c in left}
    if preemptor.tenant in tenants:
        return preemptor.tenant
    judge = Judge(snapshot, preemptor)
    best: tuple[tuple[fair_sharing.Share, ...], str] | None = None
    mine = snapshot.tenants.get(preemptor.tenant)
    remembered = (
        fair_sharing.remembered_usage(quota.snapshot_tree(snapshot, mine), ("tenant", mine.name), snapshot.tenants)
        if mine is not None and mine.cohort is not None
        else None
    )
    for name in sorted(tenants):
        view = snapshot.tenants.get(name)
        if view is None or (
            judge.tree is not None
            and judge.reclaimable(view) is None
            and not any(c.preemptible for c in left if c.tenant == name)
        ):
            continue
        path = _share_path(snapshot, view, remembered)
        if best is None or path > best[0]:
            best = (path, name)
    return best[1] if best is not None else None


def _share_path(
    snapshot: Snapshot, tenant: TenantView, remembered: Mapping[Node, float] | None
) -> tuple[fair_sharing.Share, ...]:
    """The shares of the tenant's cohorts from the root's children down, then its own (where the tree remembers
    usage, decayed usage over weight: the tenant that used most lately gives back first)."""
    tree = quota.snapshot_tree(snapshot, tenant)
    node: Node = ("tenant", tenant.name)
    path = [*reversed(tree.ancestors(node))][1:] + [node]
    known = remembered if remembered is not None and node in remembered else None
    return tuple(fair_sharing.ordering_share(tree, n, snapshot.tenants, snapshot.cohorts, known) for n in path)


def _sibling_shares(
    snapshot: Snapshot, preemptor: Preemptor, victim: Running
) -> tuple[fair_sharing.Share, fair_sharing.Share]:
    """The preemptor's share with its request admitted, and the victim tenant's, each of the child of their lowest
    common cohort on its side (Kueue's almost-LCA), on `snapshot`."""
    mine = snapshot.tenants[preemptor.tenant]
    theirs = snapshot.tenants[victim.tenant]
    tree = quota.snapshot_tree(snapshot, mine)
    me, them = ("tenant", mine.name), ("tenant", theirs.name)
    meeting = tree.lowest_common_ancestor(me, them)
    if meeting is None:
        return fair_sharing.NONE, fair_sharing.NONE
    mine_side, their_side = tree.child_towards(meeting, me), tree.child_towards(meeting, them)
    with_request = tree.usage_with(me, preemptor.request.gpu_count)[mine_side]

    def weighted(node: Node, usage: int | None = None) -> fair_sharing.Share:
        return fair_sharing.share(tree, node, fair_sharing.weight_of(node, snapshot.tenants, snapshot.cohorts), usage)

    return weighted(mine_side, with_request), weighted(their_side)


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
            )
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
