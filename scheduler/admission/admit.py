"""Queues: who among the requests waiting for capacity in a region is placed next.

A request that asked to wait and could fit once capacity frees waits in its region's queue, holding nothing. Each
admission pass walks the queue in order on the capacity as it is now:

    queued requests of one region (arrival order kept in PostgreSQL)
      -> order    each tenant's requests by priority, then arrival; of the tenants' next requests, Kueue's
                  classic order: one that fits its tenant's nominal quota before one that would borrow, then
                  the higher priority, then the earlier arrival. Where a cohort tree shares fairly
                  (`scheduler.quota.fair_sharing`), its tournament's winner stands for the whole tree. Re-judged as
                  the pass places requests
      -> for the next request in that order:
           quota           the tenant's active + in-flight GPUs + this request within its quota
           cluster level   `cluster.find_candidates` on what is left (plans in progress and the pass's own
                           admissions counted, nodes reserved for the head left out)
           placed   -> the first choice is set aside for it (a plan in progress) and the walk goes on
           refused  -> StrictFIFO: the walk stops; everyone behind waits "behind" it (a request held back by its
                       own tenant's quota blocks only its own tenant's requests behind it, as Kueue's StrictFIFO
                       blocks a ClusterQueue behind its head, whatever holds the head)
                       BestEffortFIFO: each tenant's first request refused for capacity gets a reservation
                       (below), and the walk goes on around it
      -> verdicts: position, share, and the node set aside or the reason it waits

A head's reservation is Slurm's backfill rule without runtime estimates: of the nodes that could ever hold the
head, the one that needs the fewest GPUs freed (then the name; not one held for a head before it) is set aside for
it. Nothing behind the head may be placed there, and neither may a request that never queued (`reserved_nodes`), so
the node only empties, and the head is placed the moment it has room; smaller requests fill the other nodes
meanwhile. Each tenant's head gets one (the first refused for capacity among its requests), and a tenant below its
fair share (equal weighted shares among the tenants with waiting requests) gets one for each further request refused
for capacity until, counting the held nodes' GPUs, it would reach that share: with one reservation in all, a tenant
whose waiting requests are mostly large ones saw the small requests of others fill every node that emptied, and
stayed far below its weighted share (bench/queues.py).

The holds beyond a tenant's head weigh tenants by their dominant share of the fleet's GPUs (for each product, the
GPUs the tenant holds over the fleet's GPUs of that product; the largest of those, over its weight): this decides
only which nodes are held for whom while requests wait, never who is admitted first.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from contracts.placement import CapacityShape, PlacementRequest
from contracts.reasons import Reason
from contracts.vocabulary import QueueingStrategy, SlotState
from scheduler.admission.preemption import Preemptor, Running, plan_preemption
from scheduler.admission.shares import Usage, capacity_by_product, dominant_share, product_of
from scheduler.placement import cluster
from scheduler.placement.pending import with_pending_plans
from scheduler.placement.region import quota_refusal
from scheduler.quota import accounts as quota
from scheduler.quota import fair_sharing
from scheduler.quota.cohorts import root_of
from scheduler.quota.usage_decay import ENTRY_PENALTY_SECONDS
from scheduler.snapshot import Snapshot
from scheduler.views import TenantView


@dataclass(frozen=True)
class QueuedRequest:
    """One waiting request as its queue entry keeps it: the request (tenant set), its place and its priority."""

    allocation_id: str
    tenant: str
    region: str
    priority: int
    arrival: int
    request: PlacementRequest
    enqueued: float = 0.0  # when it entered the queue (seconds since the epoch)
    preemptible: bool = False  # of a preemptible PriorityClass: it displaces nobody
    created: float = 0.0  # when it was requested: preemption's "newer" compares it (Kueue: creation times)
    never_preempts: bool = False  # of a class with `preemptionPolicy: Never`: it displaces nobody


@dataclass(frozen=True)
class Nomination:
    """What an earlier pass decided to preempt for a queued request: the node freed for it (None when its quota
    decided) and the allocations told to leave. Kept until the request is placed or leaves the queue."""

    node: str | None
    victims: tuple[str, ...]


class Standing(NamedTuple):
    """What ordered a tenant's request when its turn came: its fair-sharing share (None: weight 0 and borrowing)
    and, where its tree remembers usage, its decayed GPU-seconds (else None)."""

    share: float | None
    usage: float | None


@dataclass(frozen=True)
class Verdict:
    """What a pass decided for one queued request. `node`: set aside for it, so it is woken to place itself;
    otherwise `reason` says why it still waits, and `reserved` names the node held for it when it is the head."""

    allocation_id: str
    position: int  # 1-based, in the pass's order
    share: float | None  # its tenant's fair-sharing share when its turn came (None: weight 0 and borrowing)
    node: str | None = None
    reason: str | None = None
    code: str | None = None  # the refusal's code: quota_exceeded, insufficient_capacity, queued_behind, ...
    reserved: str | None = None
    nomination: Nomination | None = None  # preemption: the node freed for it and the allocations told to leave
    preempt_reasons: Mapping[str, str] = field(default_factory=dict)  # victim -> the rule, for new victims only
    # Its tenant's decayed GPU-seconds when its turn came, where its tree orders by them (`usageHalfLife`).
    usage: float | None = None


@dataclass
class PassResult:
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def admitted(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.node is not None]

    @property
    def reservations(self) -> dict[str, str]:
        """allocation -> the node reserved for it."""
        return {v.allocation_id: v.reserved for v in self.verdicts if v.reserved is not None}


def classic_order(tenant: TenantView | None, gpus: int, priority: int, arrival: int) -> tuple[bool, int, int]:
    """Kueue's order without fair sharing, smaller first: a request that fits its tenant's nominal quota before one
    that would borrow, then the higher priority, then the earlier arrival. The one copy of the rule: the pass walks
    by it, and a StrictFIFO newcomer counts the requests it must let go first by it."""
    borrows = tenant is not None and quota.used(tenant) + gpus > tenant.gpu_quota
    return (borrows, -priority, arrival)


def classic_key(entry: QueuedRequest, tenant: TenantView | None) -> tuple[bool, int, int]:
    return classic_order(tenant, entry.request.gpu_count, entry.priority, entry.arrival)


def ordered(queue: Iterable[QueuedRequest], snapshot: Snapshot, usage: Usage) -> list[tuple[QueuedRequest, Standing]]:
    """The queue in admission order as it stands (no placements), each with its tenant's share and decayed usage:
    for showing positions. The same order the pass walks, but for what its own placements change."""
    state = _PassState(snapshot, usage, capacity_by_product(snapshot))
    return list(state.in_order(list(queue)))


def admission_pass(
    snapshot: Snapshot,
    queue: Iterable[QueuedRequest],
    usage: Usage,
    strategy: QueueingStrategy,
    running: Iterable[Running] = (),
    nominations: Mapping[str, Nomination] | None = None,
) -> PassResult:
    """Walk one region's queue in order on `snapshot` (usage, plans in progress and reservations of requests that
    are not queued already applied) and decide, for each queued request, whether it is placed now.

    Preemption: `running` are the region's active allocations a request might displace; `nominations`
    what earlier passes decided to preempt. A nominated node is held for its request alone; a request refused for
    capacity or quota with no preemption under way gets one when its tenant's policy (or a preemptible class)
    allows (`scheduler.admission.preemption`), and the node it frees is held for it from then on."""
    queue = list(queue)
    preempting = _Preempting(snapshot, running, nominations or {})
    capacity = capacity_by_product(snapshot)
    state = _PassState(snapshot, usage, capacity)
    result = PassResult()
    blocked_by: QueuedRequest | None = None
    blocked_tenants: dict[str, QueuedRequest] = {}  # StrictFIFO: a tenant whose head its own quota holds back
    reserved: set[str] = set()
    heads: set[str] = set()  # tenants with a request that holds a node
    # The weighted dominant share each tenant with waiting requests would hold were shares equal: a tenant below it
    # gets nodes held for its requests until, counting them, it would reach it (alone in the queue: its head only).
    # (Every waiting tenant of weight 0: none has a share to be below; each gets its head's hold only.)
    waiting = {e.tenant for e in queue}
    weights = sum(_weight(snapshot, tenant) for tenant in waiting)
    fair = 1.0 / weights if len(waiting) > 1 and weights > 0 else 0.0
    for position, (entry, (share, usage)) in enumerate(state.in_order(queue), start=1):
        if blocked_by is not None:
            reason = (
                f"behind {position - 1} request(s): the head, {blocked_by.allocation_id}, does not fit (StrictFIFO)"
            )
            result.verdicts.append(
                Verdict(entry.allocation_id, position, share, usage=usage, reason=reason, code=Reason.QUEUED_BEHIND)
            )
            continue
        if (own_head := blocked_tenants.get(entry.tenant)) is not None:
            reason = f"behind {own_head.allocation_id}, its tenant's request ahead of it, held back by its quota (StrictFIFO)"
            result.verdicts.append(
                Verdict(entry.allocation_id, position, share, usage=usage, reason=reason, code=Reason.QUEUED_BEHIND)
            )
            continue
        held = frozenset(reserved | preempting.held_for_others(entry.allocation_id))
        request = entry.request.model_copy(update={"reserved_nodes": held})
        refusal = state.refusal(entry, request)
        if refusal is None:
            node = state.place(entry, request)
            if node is not None:
                result.verdicts.append(Verdict(entry.allocation_id, position, share, usage=usage, node=node))
                continue
            refusal = state.last_refusal
        code, reason = refusal
        verdict = Verdict(entry.allocation_id, position, share, usage=usage, reason=reason, code=code)
        preempted = preempting.decide(state.snapshot, entry, request, code)
        if preempted is not None:
            # The GPUs it will take are its tenant's from now on in this pass, as Kueue adds a preempting
            # workload's usage before it issues the preemptions: a tenant with room for one request never takes
            # victims for two, and later requests see the quota it is about to use.
            nomination = preempted["nomination"]
            assert isinstance(nomination, Nomination)
            state.charge(entry, nomination.node, entry.request.gpu_count, admitted=False)
            result.verdicts.append(dataclasses.replace(verdict, **preempted))
            continue
        if strategy is QueueingStrategy.STRICT_FIFO and code == Reason.QUOTA_EXCEEDED:
            blocked_tenants.setdefault(entry.tenant, entry)  # its tenant's later requests wait behind it
        elif strategy is QueueingStrategy.STRICT_FIFO:
            blocked_by = entry
        elif code == Reason.INSUFFICIENT_CAPACITY and (
            entry.tenant not in heads or state.share(entry.tenant, promised=True) < fair
        ):
            node = state.soonest(entry, request)
            if node is not None:
                reserved.add(node)
                heads.add(entry.tenant)
                state.promise(entry.tenant, node, entry.request.gpu_count)
                verdict = dataclasses.replace(verdict, reserved=node)
        result.verdicts.append(verdict)
    return result


class _Preempting:
    """The pass's preemptions: nominations kept from earlier passes, and new ones decided in this one, never two
    for the same victim or node."""

    def __init__(self, snapshot: Snapshot, running: Iterable[Running], nominations: Mapping[str, Nomination]) -> None:
        holders = {s.holder for node in snapshot.nodes.values() for s in node.slots if s.holder is not None}
        # A nomination stands while its victims still hold GPUs; once they have left, the node stays held for the
        # request until it is placed (the next pass places it there) or it leaves the queue.
        self.kept = dict(nominations)
        self.alive = {a: tuple(v for v in n.victims if v in holders) for a, n in nominations.items()}
        taken = {v for n in nominations.values() for v in n.victims}
        self.running = [r for r in running if r.allocation_id not in taken]
        self.nodes = {a: n.node for a, n in nominations.items() if n.node is not None}
        self.failed: dict[tuple[object, ...], list[tuple[int, int, float]]] = {}  # alike requests that found none

    def held_for_others(self, allocation_id: str) -> set[str]:
        return {node for owner, node in self.nodes.items() if owner != allocation_id}

    def decide(
        self, snapshot: Snapshot, entry: QueuedRequest, request: PlacementRequest, code: str
    ) -> dict[str, object] | None:
        """The verdict's preemption fields when the refused request has (or now gets) one, else None."""
        standing = self.kept.get(entry.allocation_id)
        if standing is not None and (self.alive.get(entry.allocation_id) or standing.node is not None):
            left = self.alive.get(entry.allocation_id, ())
            where = f" on node {standing.node}" if standing.node else ""
            why = (
                f"preempting {len(left)} allocation(s){where}: waiting for them to leave"
                if left
                else f"node {standing.node} is held for it: its preempted allocations have left"
            )
            return {"nomination": standing, "reason": why, "code": Reason.PREEMPTING, "reserved": standing.node}
        if code not in (Reason.INSUFFICIENT_CAPACITY, Reason.QUOTA_EXCEEDED):
            return None
        created = entry.created or entry.enqueued
        # A pass takes capacity, quota and candidates away: once a request found no preemption, one alike of its
        # tenant, no smaller, of no higher priority and created no earlier finds none either (but where this pass's
        # own placements make another tenant borrow, and so its running allocations reclaimable: the next pass,
        # which those placements' starts bring about, sees that).
        key = (
            entry.tenant,
            entry.preemptible,
            entry.never_preempts,
            code,
            _alike(entry, request.model_copy(update={"reserved_nodes": frozenset()})),
        )
        failed = self.failed.get(key)
        if failed is not None and any(
            g <= request.gpu_count and p >= entry.priority and c <= created for g, p, c in failed
        ):
            return None
        preemptor = Preemptor(
            entry.allocation_id,
            entry.tenant,
            entry.priority,
            created,
            request,
            preemptible=entry.preemptible,
            never_preempts=entry.never_preempts,
        )
        outcome = plan_preemption(snapshot, entry.region, preemptor, self.running, code)
        if isinstance(outcome, str):
            self.failed.setdefault(key, []).append((request.gpu_count, entry.priority, created))
            return None
        gone = {v.allocation_id for v in outcome.victims}
        self.running = [r for r in self.running if r.allocation_id not in gone]
        nomination = Nomination(outcome.node, tuple(sorted(gone)))
        if outcome.node is not None:
            self.nodes[entry.allocation_id] = outcome.node
        where = f" on node {outcome.node}" if outcome.node else " for its quota"
        each = "; ".join(f"{victim}: {outcome.reasons[victim]}" for victim in sorted(gone))
        return {
            "nomination": nomination,
            "reason": f"preempting {len(gone)} allocation(s){where}: {each}",
            "code": Reason.PREEMPTING,
            "reserved": outcome.node,
            "preempt_reasons": dict(outcome.reasons),
        }


def soonest_node(snapshot: Snapshot, request: PlacementRequest, region: str) -> str | None:
    """The node that will hold `request` soonest: of the READY nodes with a live agent in its matching pools whose
    hardware could ever take it (pinned ones only, if it pins), the one with the most free slots (the fewest GPUs
    to free), then the name."""
    best: tuple[int, str] | None = None
    for node in cluster.nodes_that_could_hold(snapshot, request, region):
        free = sum(1 for slot in node.slots if slot.state is SlotState.FREE)
        if best is None or (-free, node.name) < best:
            best = (-free, node.name)
    return best[1] if best is not None else None


def _weight(snapshot: Snapshot, tenant: str) -> float:
    view = snapshot.tenants.get(tenant)
    return view.weight if view is not None else 1.0


class _PassState:
    """The pass's moving state: the snapshot with its own admissions set aside, tenants' usage and shares."""

    def __init__(self, snapshot: Snapshot, usage: Usage, capacity: Mapping[str, int]) -> None:
        self.snapshot = snapshot
        self.usage: Usage = defaultdict(lambda: defaultdict(int), {t: defaultdict(int, u) for t, u in usage.items()})
        self.capacity = capacity
        self.promised: Usage = defaultdict(lambda: defaultdict(int))  # GPUs of the nodes held for each tenant
        self.unholdable: dict[tuple[object, ...], int] = {}  # alike requests: the smallest no node could be held for
        # Requests alike but for their size: once one is refused for capacity, a larger one is refused too.
        self.refused: dict[tuple[object, ...], tuple[int, tuple[str, str]]] = {}
        self.last_refusal: tuple[str, str] = ("", "")

    def share(self, tenant: str, *, promised: bool = False) -> float:
        """The tenant's weighted dominant share; `promised`: counting the nodes held for its requests too."""
        used = self.usage.get(tenant, {})
        if promised and tenant in self.promised:
            used = {p: used.get(p, 0) + self.promised[tenant].get(p, 0) for p in {*used, *self.promised[tenant]}}
        return dominant_share(used, self.capacity, _weight(self.snapshot, tenant))

    def soonest(self, entry: QueuedRequest, request: PlacementRequest) -> str | None:
        """`soonest_node` for the request, unless a request alike and no larger found no node left to hold: the
        nodes held only grow during a pass, so it would find none either."""
        key = _alike(entry, request.model_copy(update={"reserved_nodes": frozenset()}))
        if self.unholdable.get(key, 1 << 30) <= request.gpu_count:
            return None
        node = soonest_node(self.snapshot, request, entry.region)
        if node is None:
            self.unholdable[key] = min(request.gpu_count, self.unholdable.get(key, 1 << 30))
        return node

    def promise(self, tenant: str, node: str, gpus: int) -> None:
        """A node is held for one of the tenant's requests (not yet its GPUs: only for judging further holds)."""
        product = product_of(self.snapshot, node)
        if product is not None:
            self.promised[tenant][product] += gpus

    def share_of(self, tenant: str) -> float | None:
        """The tenant's fair-sharing share in its cohort tree now (`scheduler.quota.fair_sharing`), for the verdict."""
        view = self.snapshot.tenants.get(tenant)
        if view is None:
            return 0.0
        return fair_sharing.tenant_share(quota.snapshot_tree(self.snapshot, view), view).shown

    def usage_of(self, tenant: str) -> float | None:
        """The tenant's decayed GPU-seconds as the pass now counts them (with its entry penalties), if its tree
        orders by them."""
        view = self.snapshot.tenants.get(tenant)
        return view.decayed_usage if view is not None else None

    def in_order(self, queue: list[QueuedRequest]) -> Iterable[tuple[QueuedRequest, Standing]]:
        """The queue in admission order, re-judged as the pass places requests: each tenant's own requests in
        (priority, arrival) order; of the tenants' next requests, Kueue's classic order (`classic_key`), where a
        cohort tree shares fairly its tournament's winner standing for the whole tree."""
        by_tenant: dict[str, list[QueuedRequest]] = defaultdict(list)
        for entry in sorted(queue, key=lambda e: (-e.priority, e.arrival)):
            by_tenant[entry.tenant].append(entry)
        nexts = {tenant: 0 for tenant in by_tenant}
        cohorts = self.snapshot.cohorts
        fair: dict[str, set[str]] = defaultdict(set)  # root cohort -> its tenants with requests left
        heap: list[tuple[tuple[bool, int, int], str]] = []
        for tenant, entries in by_tenant.items():
            view = self.snapshot.tenants.get(tenant)
            if view is not None and fair_sharing.shares_fairly(view, cohorts):
                fair[root_of(view.cohort, cohorts) or ""].add(tenant)
            else:
                heap.append((classic_key(entries[0], view), tenant))
        heapq.heapify(heap)
        while heap or any(fair.values()):
            best: tuple[tuple[bool, int, int], str] | None = heap[0] if heap else None
            for members in fair.values():
                winner = self._tournament(members, by_tenant, nexts)
                if winner is not None:
                    key = classic_key(by_tenant[winner][nexts[winner]], self.snapshot.tenants.get(winner))
                    if best is None or (key, winner) < best:
                        best = (key, winner)
            assert best is not None
            tenant = best[1]
            if heap and heap[0][1] == tenant:
                heapq.heappop(heap)
            entry = by_tenant[tenant][nexts[tenant]]
            yield entry, Standing(self.share_of(tenant), self.usage_of(tenant))
            nexts[tenant] += 1
            left = nexts[tenant] < len(by_tenant[tenant])
            members = next((m for m in fair.values() if tenant in m), None)
            if members is not None:
                if not left:
                    members.discard(tenant)
            elif left:
                following = by_tenant[tenant][nexts[tenant]]
                heapq.heappush(heap, (classic_key(following, self.snapshot.tenants.get(tenant)), tenant))

    def _tournament(
        self, members: set[str], by_tenant: Mapping[str, list[QueuedRequest]], nexts: Mapping[str, int]
    ) -> str | None:
        """The tenant whose next request a fair-sharing tree admits next (`scheduler.quota.fair_sharing.tournament`)."""
        contenders = [
            fair_sharing.Contender(t, (e := by_tenant[t][nexts[t]]).request.gpu_count, e.priority, e.arrival)
            for t in sorted(members)
        ]
        tree = quota.snapshot_tree(self.snapshot, self.snapshot.tenants[contenders[0].tenant])
        winner = fair_sharing.tournament(contenders, tree, self.snapshot.tenants, self.snapshot.cohorts)
        return winner.tenant if winner is not None else None

    def refusal(self, entry: QueuedRequest, request: PlacementRequest) -> tuple[str, str] | None:
        """(code, reason) when the tenant's quota, or an alike request refused earlier in this pass, rules it out."""
        quota = quota_refusal(self.snapshot, request)
        if quota is not None:
            return (str(quota.code), f"quota: {quota.message}")
        alike = self.refused.get(_alike(entry, request))
        if alike is not None and alike[0] <= request.gpu_count:
            code, _ = alike[1]
            return (
                code,
                f"{entry.region}: no node can take {request.describe()} now ({alike[0]} GPUs alike do not fit)",
            )
        return None

    def place(self, entry: QueuedRequest, request: PlacementRequest) -> str | None:
        """The node the cluster level would choose first, set aside for the request; None (and `last_refusal`)
        when it does not fit on what is left."""
        decision = cluster.find_candidates(self.snapshot, request, entry.region)
        if decision.refusal is not None or not decision.candidates:
            code = str(decision.refusal.code) if decision.refusal else str(Reason.INSUFFICIENT_CAPACITY)
            message = decision.refusal.message if decision.refusal else "no candidate node"
            self.last_refusal = (code, message)
            key = _alike(entry, request)
            if code == Reason.INSUFFICIENT_CAPACITY and request.gpu_count < self.refused.get(key, (1 << 30,))[0]:
                self.refused[key] = (request.gpu_count, self.last_refusal)
            return None
        node = decision.candidates[0].node
        self.snapshot = with_pending_plans(self.snapshot, {node: [(entry.allocation_id, request.gpu_count)]})
        self.charge(entry, node, request.gpu_count)
        return node

    def charge(self, entry: QueuedRequest, node: str | None, gpus: int, *, admitted: bool = True) -> None:
        """The tenant now holds these GPUs in flight: for its quota and its share in the rest of the pass. `node`:
        where they will be (None: a preemption for its quota, on whichever node its placement finds, charged to
        the product it asked for, if any); `admitted`: placed now, rather than waiting for its victims to leave."""
        tenant = self.snapshot.tenants.get(entry.tenant)
        if node is not None:
            product = product_of(self.snapshot, node)
            pool = next((p for p in self.snapshot.pools_of(node) if p.gpu_product), None)
            place = (pool.gpu_product, pool.region) if pool is not None and pool.gpu_product else None
        else:
            product = entry.request.gpu_product
            place = (product, entry.region) if product else None
        if tenant is not None:
            held = (*tenant.held, (*place, gpus)) if place is not None else tenant.held
            # Where its tree remembers usage, what was just admitted has used nothing yet: Kueue's entry penalty
            # keeps one tenant's low usage from winning every request of the pass (scheduler/quota/usage_decay.py).
            decayed = tenant.decayed_usage
            if decayed is not None and admitted:
                decayed += gpus * ENTRY_PENALTY_SECONDS
            more = dataclasses.replace(
                tenant, in_flight_gpus=tenant.in_flight_gpus + gpus, held=held, decayed_usage=decayed
            )
            self.snapshot = self.snapshot.with_tenants([*_others(self.snapshot, entry.tenant), more])
        if product is not None:
            self.usage[entry.tenant][product] += gpus


def _others(snapshot: Snapshot, tenant: str) -> list[TenantView]:
    return [view for name, view in snapshot.tenants.items() if name != tenant]


def _alike(entry: QueuedRequest, request: PlacementRequest) -> tuple[object, ...]:
    """What decides whether a request fits, but for its size and tenant (the quota is judged on its own)."""
    return (
        entry.region,
        request.gpu_product and request.gpu_product.casefold(),
        request.shape,
        tuple(request.selectors),
        tuple(sorted(request.cluster_selector.items())),
        request.nodes,
        request.gpus,
        request.numa_policy,
        request.exclude_nodes,
        request.reserved_nodes,
        request.gpu_count if request.shape is CapacityShape.BAREMETAL else None,  # bare metal: exactly its size
    )
