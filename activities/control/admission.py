"""Control-side queue activities: entering and leaving a region's queue, and the admission pass.

    enter_queue    the allocation's trail (`queued`), then its entry (a re-entry keeps its place), then a pass
                   (unless it waits behind others or behind a head that holds its node)
    leave_queue    the trail, then the entry goes (timed out, cancelled)
    admit_queued   for each region, under the region's placement lock, in one transaction:
                     forget what the last pass set aside (it is judged again; not for requests woken lately, which
                     are placing themselves) -> read the queue, the snapshot and who holds what ->
                     scheduler.admission.admit.admission_pass -> record each verdict that changed, mark the woken
                   then signal `wake` to each allocation given a node: it places itself (its own choose_placement,
                   which finds the node set aside for it and nobody else's)

A pass decides nothing durable but the entries' verdicts, and places nothing itself: a crash anywhere in it loses
nothing (the entries are in PostgreSQL, their arrival kept) and places nothing twice (the woken workflow's own
placement and claims are exactly-once as ever). A request woken whose signal was lost is signalled again by a later
pass once its set-aside is older than `RESIGNAL_AFTER` (the reconciler runs a pass every minute).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from contracts.allocation import AdmitInput, AdmitResult, EnterQueueInput, LeaveQueueInput, PreemptNotice
from contracts.reasons import Reason
from scheduler.admission.admit import PassResult, Verdict, admission_pass
from scheduler.admission.reservations import with_holds
from scheduler.admission.shares import usage_by_product
from scheduler.placement.pending import with_pending_plans
from store import queue, reservations
from store.db import AsyncSession, async_sessionmaker
from store.decisions import lock_region
from store.inventory import InventoryCache
from store.trail import write_trail
from store.usage import with_decayed_usage

WAKE_SIGNAL = "wake"
PREEMPT_SIGNAL = "preempt"
RESIGNAL_AFTER = timedelta(seconds=10)  # a woken request places itself well within this


class PassTimes:
    """How long admission passes took (milliseconds, per process): the benchmark reports them."""

    def __init__(self) -> None:
        self.held: deque[float] = deque(maxlen=20_000)


PASS_TIMES = PassTimes()


class AdmissionActivities:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], client: Client, inventory: InventoryCache | None = None
    ) -> None:
        """`inventory`: the placement activities' cache, shared so the worker keeps one copy of the fleet."""
        self.sessions = sessions
        self.client = client
        self.inventory = inventory or InventoryCache()
        self._waiting: dict[str, asyncio.Future[tuple[list[str], int]]] = {}  # passes not yet holding the lock

    @activity.defn(name="enter_queue")
    async def enter_queue(self, request: EnterQueueInput) -> AdmitResult:
        """In the queue, then the region's queue walked: capacity may have freed since the request was refused
        (its pass found nobody to wake), and a new head needs its reservation before anyone takes its node. Not when
        it waits behind others (StrictFIFO) or the queue's head already holds a node: then no pass could place it
        now, and a pass per arrival would make filling a long queue cost its length squared."""
        await write_trail(self.sessions, request.trail)
        ticket = request.ticket
        async with self.sessions.begin() as session:
            await queue.enter(
                session,
                allocation_id=request.allocation_id,
                tenant=request.tenant,
                region=request.region,
                priority=ticket.priority,
                priority_class=ticket.priority_class,
                request=request.request.model_dump(mode="json"),
                gpu_count=request.request.gpu_count,
                deadline_at=request.deadline_at,
                reason=request.reason,
                code=request.code,
            )
            held = await queue.has_reservation(session, request.region)
        if request.code == Reason.QUEUED_BEHIND or held:
            return AdmitResult()  # behind others, or behind a head holding its node: no pass could place it now
        return await self.walk([request.region])

    @activity.defn(name="leave_queue")
    async def leave_queue(self, request: LeaveQueueInput) -> AdmitResult:
        """Out of the queue; in a StrictFIFO region those behind it may pass now, so the region is walked again."""
        await write_trail(self.sessions, request.trail)
        async with self.sessions.begin() as session:
            left = await queue.leave(session, request.allocation_id)
        if not left or request.region is None:
            return AdmitResult()
        return await self.walk([request.region])

    @activity.defn(name="admit_queued")
    async def admit_queued(self, request: AdmitInput) -> AdmitResult:
        """Walk the queues of these regions (every region with a queue when None) and wake who can be placed."""
        await write_trail(self.sessions, request.trail)
        return await self.walk(request.regions)

    async def walk(self, regions: list[str] | None) -> AdmitResult:
        """Walk these regions' queues (every region with a queue when None) and wake who can be placed."""
        checked = regions is None
        if regions is None:
            async with self.sessions() as session:
                regions = await queue.queued_regions(session)
        woken: list[str] = []
        notices: list[tuple[str, PreemptNotice]] = []
        waiting = 0
        for region in regions:
            admitted, left, told = await self._coalesced(region, checked)
            woken += admitted
            notices += told
            waiting += left
        for victim, notice in notices:  # first: the sooner a victim hears, the sooner its grace period ends
            await self._signal(victim, PREEMPT_SIGNAL, notice)
        for allocation_id in woken:
            await self._signal(allocation_id, WAKE_SIGNAL)
        return AdmitResult(woken=woken, waiting=waiting)

    async def _coalesced(
        self, region: str, checked: bool = False
    ) -> tuple[list[str], int, list[tuple[str, PreemptNotice]]]:
        """The region's pass, or a share in one of this process's that is still waiting for the region's lock: that
        one reads the queue and the capacity only once it holds the lock, so it sees whatever this caller freed
        (committed before it asked), and a burst of releases makes one pass instead of one each, queued on the
        lock. Only the pass's own caller sends its signals.

        A region whose queue is empty is not walked (unless `checked`: its entries were just seen): most releases
        free capacity nobody waits for, and the pass would take the region's placement lock only to read an empty
        queue. Reading the queue without the lock loses no wake: the caller committed what it freed before this
        read, so an entry this read cannot see committed after it, and its own `enter_queue` walks the region after
        that commit, seeing the freed capacity."""
        pending = self._waiting.get(region)
        if pending is None and not checked:
            async with self.sessions() as session:
                if not await queue.queued_regions(session, among=[region]):
                    return [], 0, []
            pending = self._waiting.get(region)  # one may have started meanwhile
        if pending is not None:
            _, left, _ = await asyncio.shield(pending)
            return [], left, []
        pending = asyncio.get_running_loop().create_future()
        self._waiting[region] = pending
        try:
            result = await self._pass(region)
        except BaseException as error:
            if not pending.done():
                pending.set_exception(error)
                pending.exception()  # retrieved here: a failure nobody shared is no "never retrieved" warning
            raise
        finally:
            if self._waiting.get(region) is pending:
                del self._waiting[region]
        pending.set_result(result)
        return result

    async def _pass(self, region: str) -> tuple[list[str], int, list[tuple[str, PreemptNotice]]]:
        """One region's pass, in one transaction under the region's lock: (allocations to wake, entries left
        waiting). The entries given a node are marked woken in the same transaction, so the next pass (which may
        start the moment this one commits) neither signals them again nor takes their nodes back while they place
        themselves; a signal lost to a crash after the commit is sent again once `RESIGNAL_AFTER` has passed."""
        async with self.sessions.begin() as session:
            await lock_region(session, region)
            if self._waiting.get(region) is not None:  # from here on, a new caller starts a pass of its own
                del self._waiting[region]
            started = time.perf_counter()
            entries = await queue.entries(session, region=region)
            if not entries:
                return [], 0, []
            now = datetime.now(UTC)
            placing = {e.allocation_id for e in entries if e.node and e.woken_at and now - e.woken_at <= RESIGNAL_AFTER}
            judged = [e for e in entries if e.allocation_id not in placing]
            # As the forget below leaves each judged entry: only the verdicts that differ from it are written.
            standing = {
                e.allocation_id: queue.PassRecord(
                    e.allocation_id,
                    None,
                    None,
                    e.reason,
                    e.code,
                    e.nominated_node,
                    tuple(e.victims) if e.victims is not None else None,
                )
                for e in judged
            }
            await queue.forget_set_asides(session, region, keep=placing)
            base, plans = await self.inventory.snapshot_and_plans(session)
            held = await reservations.holds(session, only_reserved=True)  # a started one's allocation goes first
            snapshot = with_holds(with_pending_plans(base, plans), held, None, preemptible=False, own=None)
            # Where a cohort tree orders by usage that remembers, each tenant's decayed GPU-seconds, carried forward.
            snapshot = await with_decayed_usage(session, snapshot, now, fold=True)
            strategy = snapshot.regions[region].queueing_strategy if region in snapshot.regions else None
            usage = usage_by_product(snapshot, await queue.holdings(session))
            facts = (await queue.class_facts(session)).facts
            active = {a.running.allocation_id: a for a in await queue.active_allocations(session, region)}
            nominations = {e.allocation_id: e.nomination for e in entries if e.nomination is not None}
            if strategy is None:  # the region left the fleet: its requests wait until they time out
                verdicts = PassResult()
            else:
                queued = [e.queued(facts.get(e.priority_class) if e.priority_class else None) for e in judged]
                running = [a.running for a in active.values()]
                verdicts = admission_pass(snapshot, queued, usage, strategy, running, nominations)
            changed = [r for r in map(_record, verdicts.verdicts) if r != standing.get(r.allocation_id)]
            await queue.record_pass(session, changed)
            woken = [v.allocation_id for v in verdicts.admitted]
            await queue.mark_woken(session, woken, now)
            PASS_TIMES.held.append(1000 * (time.perf_counter() - started))
        by_id = {e.allocation_id: e for e in entries}
        return woken, len(judged) - len(woken), _notices(verdicts.verdicts, by_id, active)

    async def _signal(self, allocation_id: str, signal: str, argument: object = None) -> None:
        handle = self.client.get_workflow_handle(f"allocation/{allocation_id}")
        try:
            await (handle.signal(signal) if argument is None else handle.signal(signal, argument))
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise
            # The workflow ended meanwhile (cancelled, timed out): its entry goes with its last step.

    def activities(self) -> list[object]:
        return [self.enter_queue, self.leave_queue, self.admit_queued]


def _notices(
    verdicts: list[Verdict], entries: dict[str, queue.QueueEntry], active: dict[str, queue.ActiveAllocation]
) -> list[tuple[str, PreemptNotice]]:
    """The preemption notices to send: to every victim of a nomination that is still active (a new victim, or one
    whose notice was lost: the workflow takes a second notice as the first). The notice names the preemptor's
    priority and class, never its tenant."""
    notices = []
    for verdict in verdicts:
        if verdict.nomination is None:
            continue
        entry = entries[verdict.allocation_id]
        for victim in verdict.nomination.victims:
            if victim not in active:
                continue
            why = verdict.preempt_reasons.get(victim) or "its preemption was decided by an earlier admission pass"
            notice = PreemptNotice(
                priority=entry.priority,
                priority_class=entry.priority_class,
                grace_seconds=active[victim].grace_seconds,
                rule=why,
            )
            notices.append((victim, notice))
    return notices


def _record(verdict: Verdict) -> queue.PassRecord:
    nomination = verdict.nomination
    return queue.PassRecord(
        allocation_id=verdict.allocation_id,
        node=verdict.node,
        reserved_node=verdict.reserved,
        reason=verdict.reason,
        code=verdict.code,
        nominated_node=nomination.node if nomination is not None else None,
        victims=nomination.victims if nomination is not None else None,
    )
