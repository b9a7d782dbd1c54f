"""Control-side placement activities: thin adapters that read a current snapshot and ask the pure scheduler.

    read (no lock): inventory from the worker's cache + live state + plans in progress
      -> region level                                   (refused: answer now)
      -> cluster level on what is known now             (cannot fit now: answer now, without queueing for the lock)
      -> first choice recorded in one statement, under the region's lock, if what others took on that node since the
         read still leaves it room (if not: read again, rank again, record again)

The snapshot comes from the worker's `InventoryCache`: the inventory is re-read only in the parts that changed; the
claims, slot states, tenant usage, plans in progress and the node breaker's recent failures on every call. The
candidates travel with their pools' deadlines, which the workflow applies from then on.

`choose_placement` takes the region and cluster decisions in one step on one read (the allocation workflow runs it
as a local activity); `find_candidates` is the cluster level alone, for the one re-plan a run makes when its list
runs out.

The scheduler's levels run in a worker thread (`asyncio.to_thread`), never on the worker's event loop: a request's
CEL selectors may cost up to their budget of CPU, and meanwhile the loop must go on running other allocations'
activities and the workflow tasks of the worker. One step's levels charge one CEL budget (`scheduler.cel`); past it
the step refuses with `selector_cost_exceeded`, naming the selector."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from temporalio import activity

from contracts.allocation import (
    AuditTrail,
    CandidateList,
    FindCandidatesInput,
    PlacementChoice,
    QueueTicket,
    RegionChoice,
    StateChange,
)
from contracts.explanation import Explanation
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from contracts.vocabulary import QueueingStrategy
from scheduler.admission.admit import classic_order
from scheduler.admission.reservations import with_holds
from scheduler.breaker import BreakerPolicy
from scheduler.cel import RequestBudget, SelectorCostExceeded, request_budget
from scheduler.placement import cluster, region
from scheduler.placement.pending import Plans, seen_on, with_pending_plans
from scheduler.snapshot import Snapshot
from store import queue, reservations
from store.db import AsyncSession, async_sessionmaker
from store.decisions import Recorded, record_first_choice
from store.inventory import InventoryCache
from store.trail import write_trail, write_trail_in

T = TypeVar("T")
R = TypeVar("R", RegionChoice, CandidateList)
SELECTOR_COST_EXCEEDED = SelectorCostExceeded.code


class RegionLockTimes:
    """How long decisions waited for a region's placement lock and held it, in milliseconds, per process, as the
    database measured them (`store.decisions.Recorded`). The lock serialises a region's decisions, so the time it is
    held bounds the region's placement rate; the benchmark reports both (`bench.allocation`)."""

    def __init__(self, keep: int = 20_000) -> None:
        self.waited: deque[float] = deque(maxlen=keep)
        self.held: deque[float] = deque(maxlen=keep)
        self.fast_refusals = 0  # requests refused before queueing for the lock: they could not fit anyway
        self.moved = 0  # choices not recorded: what others took on the chosen node since the read left no room
        self.unchecked = 0  # choices recorded without the check, after `MAX_RANKINGS` rankings found no room

    def clear(self) -> None:
        self.waited.clear()
        self.held.clear()
        self.fast_refusals = self.moved = self.unchecked = 0

    def add(self, outcome: Recorded) -> None:
        self.waited.append(outcome.waited_ms)
        self.held.append(outcome.held_ms)
        self.moved += not outcome.recorded


LOCK_TIMES = RegionLockTimes()
MAX_RANKINGS = 8  # rankings of one decision on fresh plans before its choice is recorded without the check


async def _off_loop(budget: RequestBudget, level: Callable[[], T]) -> T:
    """Run one scheduler level in a worker thread, charging the step's CEL budget; raises SelectorCostExceeded."""

    def charged() -> T:
        with request_budget(budget):
            return level()

    return await asyncio.to_thread(charged)


def _too_costly(error: SelectorCostExceeded, refused: R) -> R:
    """`refused` saying that the request's selectors passed their budget."""
    message = str(error)
    explanation = Explanation(summary=message, levels=[])
    update = {"refusal_code": SELECTOR_COST_EXCEEDED, "refusal_message": message, "explanation": explanation}
    return refused.model_copy(update=update)


async def _region_choice(snapshot: Snapshot, request: PlacementRequest, budget: RequestBudget) -> RegionChoice:
    try:
        decision = await _off_loop(budget, lambda: region.select_region(snapshot, request))
    except SelectorCostExceeded as error:
        return _too_costly(error, RegionChoice(region=None))
    if decision.refusal is None:
        return RegionChoice(region=decision.region)  # the explanation travels only with a refusal
    return RegionChoice(
        region=None,
        refusal_code=str(decision.refusal.code),
        refusal_message=decision.refusal.message,
        explanation=Explanation(summary=decision.refusal.message, levels=list(decision.levels)),
    )


def _candidate_list(snapshot: Snapshot, decision: cluster.CandidateDecision) -> CandidateList:
    if decision.refusal is None:
        pools = {pool.key: pool for pool in snapshot.pools}
        chosen = [pools[c.pool] for c in decision.candidates]
        deadlines = {pool.key: dict(pool.deadlines) for pool in chosen if pool.deadlines}
        max_leases = {pool.key: pool.max_lease_seconds for pool in chosen if pool.max_lease_seconds is not None}
        return CandidateList(candidates=decision.candidates, deadlines=deadlines, max_leases=max_leases)
    return CandidateList(
        refusal_code=str(decision.refusal.code),
        refusal_message=decision.refusal.message,
        explanation=Explanation(summary=decision.refusal.message, levels=list(decision.levels)),
    )


async def _quota_wait(
    choice: PlacementChoice, snapshot: Snapshot, request: PlacementRequest, budget: RequestBudget
) -> PlacementChoice:
    """A request refused by its tenant's quota may wait, in the region `scheduler.placement.region.waiting_region` gives."""
    try:
        waits_in = await _off_loop(budget, lambda: region.waiting_region(snapshot, request))
    except SelectorCostExceeded:
        return choice
    if waits_in is None:
        return choice
    return choice.model_copy(update={"waitable": True, "queue_region": waits_in})


def _behind(region_choice: RegionChoice, ahead: int) -> PlacementChoice:
    """Refused for now: the region's StrictFIFO queue has `ahead` requests to place first."""
    message = f"{region_choice.region}: behind {ahead} queued request(s) (StrictFIFO)"
    candidates = CandidateList(
        refusal_code=str(Reason.QUEUED_BEHIND),
        refusal_message=message,
        explanation=Explanation(summary=message, levels=[]),
    )
    return PlacementChoice(
        region=region_choice, candidates=candidates, waitable=True, queue_region=region_choice.region
    )


class PlacementActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        inventory: InventoryCache | None = None,
        breaker: BreakerPolicy | None = None,
    ) -> None:
        """`breaker`: the node breaker's policy (default: the settings, `BERTH_BREAKER_*`); nodes cooling off are not
        ranked."""
        self.sessions = sessions
        self.inventory = inventory or InventoryCache(breaker=breaker)

    async def _read(
        self,
        allocation_id: str,
        request: PlacementRequest,
        trail: AuditTrail | None = None,
        retract: StateChange | None = None,
    ) -> tuple[Snapshot, Plans, frozenset[str]]:
        """The snapshot without plans in progress, those plans as they are now (both without the lock), and the
        nodes held for the head of a queue other than this allocation. The GPUs of reservations this request would
        overlap are held from it: a request with no end, or one ending after a window starts, does not see them as
        free, unless it is of a preemptible class (the reservation's start preempts it).

        The step's trail (`trail`, `retract`: `store.trail.write_trail`) is written first in the same transaction:
        nothing after it can roll it back but a failure of the read itself, and the step is then tried again."""
        async with self.sessions.begin() as session:
            if trail:
                await write_trail_in(session, trail, retract)
            base, plans = await self.inventory.snapshot_and_plans(session, exclude_allocation=allocation_id)
            held = await reservations.holds(session)
            nodes = await queue.reserved_nodes(session, allocation_id)
            preemptible = bool(held) and await queue.is_preemptible(session, allocation_id)
        if held:
            ends = time.time() + request.lease_seconds if request.lease_seconds is not None else None
            base = with_holds(base, held, ends, preemptible=preemptible, own=request.reservation_id)
        return base, plans, nodes

    async def _candidates(
        self,
        base: Snapshot,
        plans: Plans,
        request: PlacementRequest,
        region_name: str,
        allocation_id: str,
        budget: RequestBudget,
        leaves_queue: bool = False,
    ) -> CandidateList:
        """Cluster level. Decisions in one region are recorded one at a time: each overlays what is being planned
        right now on the inventory, ranks, and records its first choice as being planned only if what others took on
        that node since it read it (planned, set aside, claimed) still leaves it room, so requests that arrive together
        spread out instead of all picking the same best-ranked node (the node agent stays the authority; this only makes
        the first choice a good guess).

        A request that cannot fit on what is known now is refused before anything is recorded: waiting could only
        show it more plans in progress. The ranking runs outside the region's lock; only the check and the write
        are under it, in one statement (`store.decisions`). When the node has no room left, the live state is read
        again and the ranking redone (other decisions filled that node meanwhile: the region made progress); after
        `MAX_RANKINGS` the last choice is recorded without the check, a guess that the node agent still judges."""

        def rank(snapshot: Snapshot) -> cluster.CandidateDecision:
            return cluster.find_candidates(snapshot, request, region_name)

        try:
            known = with_pending_plans(base, plans)
            decision = await _off_loop(budget, functools.partial(rank, known))
            if decision.refusal is not None:
                LOCK_TIMES.fast_refusals += 1
                return _candidate_list(known, decision)
            for ranking in range(1, MAX_RANKINGS + 1):
                if not decision.candidates:
                    break
                first = decision.candidates[0]
                seen = seen_on(known, plans, first.node) if ranking < MAX_RANKINGS else None
                spare = max(0, first.free_bundles - request.gpu_count)  # its room beyond this request
                outcome = await record_first_choice(
                    self.sessions, region_name, allocation_id, first.node, seen, spare, leave_queue=leaves_queue
                )
                LOCK_TIMES.add(outcome)
                if outcome.recorded:
                    LOCK_TIMES.unchecked += seen is None
                    break
                # Read again, claims with plans (a plan made since may be claims now) and the nodes held for a
                # queue's head. The same devices: their pairs are paid already, the budget cannot run out here.
                base, plans, reserved = await self._read(allocation_id, request)
                request = request.model_copy(update={"reserved_nodes": reserved})
                known = with_pending_plans(base, plans)
                decision = await _off_loop(budget, functools.partial(rank, known))
        except SelectorCostExceeded as error:
            return _too_costly(error, CandidateList())
        return _candidate_list(known, decision)

    @activity.defn(name="choose_placement")
    async def choose_placement(self, request: FindCandidatesInput) -> PlacementChoice:
        """The region and cluster levels (docs/seeds.md, "Four layers, each deciding only what it knows") in one
        step on one read: the allocation's first control step.

        A refusal here is the allocation's end (no attempt has been made). When the workflow hands over its final
        step (`request.final`), the refusal is recorded as that step here, so a refused allocation costs one write
        and one local activity. An earlier try of this step may have recorded a refusal that this try does not
        make (the worker crashed before the workflow took the answer): the trail's write retracts it first."""
        base, plans, reserved = await self._read(
            request.allocation_id, request.request, request.trail, retract=request.final
        )
        asked = request.request.model_copy(update={"reserved_nodes": reserved}) if reserved else request.request
        budget = RequestBudget()  # one for both levels: the cluster level pays nothing for pairs the region level paid
        known = with_pending_plans(base, plans)
        region_choice = await _region_choice(known, asked, budget)
        wait = request.wait
        if region_choice.region is None:
            choice = PlacementChoice(region=region_choice)
            if wait is not None and region_choice.refusal_code == Reason.QUOTA_EXCEEDED:
                choice = await _quota_wait(choice, known, asked, budget)
        elif (
            wait is not None
            and not wait.queued
            and (ahead := await self._queue_ahead(known, region_choice.region, wait, asked))
        ):
            choice = _behind(region_choice, ahead)
        else:
            candidates = await self._candidates(
                base,
                plans,
                asked,
                region_choice.region,
                request.allocation_id,
                budget,
                wait is not None and wait.queued,
            )
            choice = PlacementChoice(region=region_choice, candidates=candidates)
            # A reservation's allocation waits for its own node (pinned) to empty, as its start preempted for it.
            for_reservation = (
                asked.reservation_id is not None and candidates.refusal_code == Reason.PINNED_NODES_UNAVAILABLE
            )
            if candidates.refusal_code == Reason.INSUFFICIENT_CAPACITY or for_reservation:
                choice = choice.model_copy(update={"waitable": True, "queue_region": region_choice.region})
        refusal = choice.refusal()
        if refusal is None or request.final is None or (wait is not None and choice.waitable):
            return choice
        final = request.final.model_copy(update={"reason": refusal.reason, "region": region_choice.region})
        steps = [final]
        if choice.candidates is not None:  # the cluster level refused: its decision is a step of the story too
            steps.insert(0, final.model_copy(update={"state": "placing", "step": "find_candidates", "reason": None}))
        await write_trail(self.sessions, AuditTrail(changes=steps))
        return choice.model_copy(update={"final_recorded": True})

    @activity.defn(name="find_candidates")
    async def find_candidates(self, request: FindCandidatesInput) -> CandidateList:
        """Cluster level: pool eligibility and ranked candidate nodes (the chosen one plus alternates)."""
        base, plans, reserved = await self._read(request.allocation_id, request.request, request.trail)
        asked = request.request.model_copy(update={"reserved_nodes": reserved}) if reserved else request.request
        return await self._candidates(base, plans, asked, request.region, request.allocation_id, RequestBudget())

    async def _queue_ahead(
        self, snapshot: Snapshot, region_name: str, wait: QueueTicket, request: PlacementRequest
    ) -> int:
        """How many queued requests a newcomer that may wait must let go first: in a StrictFIFO region, those no pass
        has placed yet that go before it in the queue's order (its own tenant's of its priority or higher; of other
        tenants', Kueue's order: one within its tenant's nominal quota before one that would borrow, then the higher
        priority, then the earlier arrival, the newcomer's being the latest); in a BestEffortFIFO region, none."""
        view = snapshot.regions.get(region_name)
        if view is None or view.queueing_strategy is not QueueingStrategy.STRICT_FIFO:
            return 0
        async with self.sessions() as session:
            waiting = await queue.waiting_ahead(session, region_name, wait.priority)

        own = request.tenant or ""
        # Every waiting request arrived before the newcomer: arrival 0 for them, 1 for it.
        mine = classic_order(snapshot.tenants.get(own), request.gpu_count, wait.priority, 1)

        def blocks(tenant: str, gpus: int, priority: int, code: str | None) -> bool:
            if tenant == own:  # its own tenant's earlier requests of its priority or higher: a queue keeps its order
                return True
            if code in (Reason.QUOTA_EXCEEDED, Reason.QUEUED_BEHIND):  # held back for its own tenant, or behind
                return False  # another that is counted here itself (StrictFIFO blocks a tenant behind its quota)
            return classic_order(snapshot.tenants.get(tenant), gpus, priority, 0) < mine

        return sum(1 for entry in waiting if blocks(*entry))

    def activities(self) -> list[object]:
        return [self.choose_placement, self.find_candidates]
