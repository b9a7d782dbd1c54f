"""The allocation workflow: seed 004's placement flow, made durable (docs/design.md section 2).

    1. select_region       tenant policy, quota, region status, product and price
    2. find_candidates     a pool and ranked candidate nodes from a fresh snapshot
                           (1 and 2 are one local activity, `choose_placement`, recording both steps)
       queued              a request that may wait and could fit once capacity frees waits in its region's queue,
                           holding nothing, until an admission pass wakes it (then 1 and 2 again) or its timeout
                           passes (failed, queue_timeout)
    3. for each candidate  plan_bundles (node lease) -> record_claims -> create_vm -> wait_ready;
                           a failure compensates what the attempt did, in reverse, and moves to the next node;
                           when the list runs out, the cluster level re-plans once (`find_candidates`)
    4. active              the run holds the capacity until `release`, cancellation, its end or a preemption, then
                           tears down (destroy_vm and wipe, release_claims); a hold whose history grows long hands
                           over to a fresh run of its own (continue-as-new), saying so on both
    5. no candidate left   fail with a non-retryable SkuUnavailable naming every attempt's node and reason
    6. capacity freed      releasing claims (a release, a cancel, a failed attempt's undo) walks the region's queue
                           in the same step

This module is the run and steps 1, 2 and 5, with 3's loop over the candidates; its parts are base classes of the
workflow: the attempt on one node (allocation_attempt.py), the hold, 4 (allocation_hold.py), the message handlers
(allocation_handlers.py), and what they all stand on: the calls out and the compensations, 6 (allocation_calls.py).

Every state change is mirrored to PostgreSQL (the allocation's row and its events) and to the Temporal UI
(workflows/allocation/mirror.py); each state has a deadline (workflows/allocation/deadlines.py). Control steps run as
local activities on the worker that runs the workflow: no task-queue round trip, no activity task on the server.
Compensations run even when the workflow is being cancelled, and a node that cannot be reached for teardown gets
its slots quarantined rather than blocking the allocation forever.

Revisions (`AllocationInput.revision`, workflows/allocation/messages.py): a run keeps the revision it started with.
The code keeps the current revision and the previous one; a placement phase drains within its per-state deadlines,
and a held allocation of an older revision is handed over to a hold run on an operator's `hand_over` signal before
an upgrade drops its revision (docs/design.md, "Upgrading").
"""

from __future__ import annotations

import zlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import (
        FINAL_STATES,
        CandidateList,
        EnterQueueInput,
        FindCandidatesInput,
        QueueTicket,
        RegionChoice,
    )
    from contracts.failures import PLACEMENT_REFUSED, QUEUE_TIMEOUT, QUOTA_EXCEEDED, SKU_UNAVAILABLE
    from contracts.placement import Candidate
    from fleet.deadlines import format_duration
    from workflows.allocation.attempt import CandidateAttempt
    from workflows.allocation.deadlines import StateClock
    from workflows.allocation.failures import AttemptFailed
    from workflows.allocation.handlers import Inbox, MessageHandlers
    from workflows.allocation.hold import HAND_OVER, REPLACE, AllocationHold
    from workflows.allocation.messages import AllocationInput, AllocationStatus
    from workflows.allocation.mirror import Mirror
    from workflows.saga import shielded


@workflow.defn(name="Allocation")
class AllocationWorkflow(CandidateAttempt, AllocationHold, MessageHandlers):
    @workflow.init
    def __init__(self, input: AllocationInput) -> None:
        self.input = input
        held = input.held
        self.status = (
            held.status.model_copy(update={"run_id": workflow.info().run_id})
            if held is not None
            else AllocationStatus(
                allocation_id=input.allocation_id,
                run_id=workflow.info().run_id,
                tenant=input.tenant,
                state="pending",
                step="accepted",
            )
        )
        self.mirror = Mirror(input, self.status)
        deadlines = held.deadlines if held is not None else input.timing.deadlines
        self.clock = StateClock(
            lambda: self.status.state, deadlines, timedelta(seconds=input.timing.agent_pickup_seconds)
        )
        self.inbox = Inbox()  # what the messages asked, for the flow to act on (allocation_handlers.py)
        # The placement: steps 1 to 3.
        self.excluded: set[str] = set(input.request.exclude_nodes)
        self.tried: set[str] = set()  # never the same node twice in one run
        self.pool_deadlines: dict[str, dict[str, float]] = {}
        self.pool_max_leases: dict[str, float] = {}
        self.final_recorded = False  # the placement step refused and recorded the final step itself
        # Queued: waiting in its region's queue.
        self.queue_deadline = (
            workflow.now() + timedelta(seconds=input.queue.timeout_seconds) if input.queue is not None else None
        )
        self.in_queue = False
        self.fruitless = 0  # times it was woken (or placed) and could not be placed after all
        # The hold: step 4.
        self.active_since = held.active_since if held is not None else None
        self.max_lease = held.max_lease_seconds if held is not None else None

    @workflow.run
    async def run(self, input: AllocationInput) -> AllocationStatus:
        try:
            if input.held is None:
                self.mirror.open()
                region, first = await self.choose_placement()  # 1, 2 (queued between them and here, if it waits)
                while not await self.place_or_wait(region, first):  # 3 (and 5 when nothing works)
                    region, first = await self.choose_placement(woken=True)
                if not self.holds_itself():
                    await self.continue_into_hold()  # revisions 2 and 3: 4 in a hold run of its own
            workflow.set_current_details(self.mirror.story())
            ending = await self.hold_until_released()  # 4
            while ending in (REPLACE, HAND_OVER):
                if ending == HAND_OVER:
                    await self.hand_over()  # continues as new, unless a release or a notice came meanwhile
                elif not self.holds_itself():
                    await self.move_off_failed_gpu()  # 3 again, then a new hold run (revisions 2 and 3)
                    ending = "released", "release"  # released while it moved: the new placement is given back
                    break
                else:
                    await self.move_off_failed_gpu()  # 3 again, on a healthy node, then the hold goes on
                ending = await self.hold_until_released()
            await shielded(self.teardown(*ending))
        except BaseException as error:
            if is_cancelled_exception(error) and self.status.state not in FINAL_STATES:
                await shielded(self.teardown("cancelled", "cancel"))
            elif isinstance(error, ApplicationError):
                await shielded(self.leave_queue())  # refused for good after a wake: the entry goes
                self.set_state("failed", "failed", reason=error.message, recorded=self.final_recorded)
                await shielded(self.mirror.write_trail())
            raise
        return self.status

    async def place_or_wait(self, region: str, first: list[Candidate]) -> bool:
        """Step 3; for a request that may wait, every candidate failing for now (another allocation took the slots
        first, say) sends it back to its queue with the reason, rather than failing: False, then woken to decide
        again. Past its queue timeout it fails as any queued request does."""
        try:
            await self.place(region, first)
            return True
        except ApplicationError as error:
            if error.type != SKU_UNAVAILABLE or self.input.queue is None:
                raise
            self.tried.clear()  # a new round after the wait: every node may be tried again
            self.fruitless += 1
            await self.wait_in_queue(region, error.message, "sku_unavailable")
            return False

    async def choose_placement(self, *, woken: bool = False) -> tuple[str, list[Candidate]]:
        """Steps 1 and 2 as one control step on one snapshot; the trail still records each decision as its step.

        The UI shows `placing` from the run's start (revision 6; before, it learnt it with the decision) and learns
        the region with the next state it shows, and the step records a refusal as the allocation's final step: a
        request refused here costs one local activity, one search-attribute upsert (`failed`) and one write.
        `woken`: a queued request deciding again (its state is set already)."""
        if not woken:
            self.set_state("placing", "select_region", publish=False)
        while True:
            final = self.mirror.state_change("failed", "failed")
            placement = self.placement_input("").model_copy(update={"final": final, "wait": self.queue_ticket()})
            try:
                choice = await self.on_control(steps.choose_placement, placement, deadline=self.clock.time_left())
            except AttemptFailed as failure:
                raise failure.ending() from failure
            if not (choice.waitable and self.input.queue is not None):
                if choice.refusal() is None:
                    self.in_queue = False  # the step took it out of the queue with its first choice
                break
            self.fruitless += 1 if self.status.step == "woken" else 0
            refusal = choice.refusal()
            assert refusal is not None and choice.queue_region is not None
            reason = refusal.refusal_message or refusal.refusal_code or "no room now"
            await self.wait_in_queue(choice.queue_region, reason, refusal.refusal_code or "")
        self.final_recorded = choice.final_recorded  # a refusal: the step recorded its decisions and the end
        region = self.accept_region(choice.region)
        self.set_state(
            "placing", "find_candidates", region=region, publish=not self.final_recorded, recorded=self.final_recorded
        )
        assert choice.candidates is not None  # the region level chose one, so the cluster level ran
        return region, self.accept_candidates(choice.candidates)

    def queue_ticket(self) -> QueueTicket | None:
        """What the placement step needs to know of a request that may wait: its priority, and whether it is in its
        region's queue already."""
        wait = self.input.queue
        if wait is None:
            return None
        return QueueTicket(priority=wait.priority, priority_class=wait.priority_class, queued=self.in_queue)

    async def wait_in_queue(self, region: str, reason: str, code: str) -> None:
        """Queued: in the region's queue (keeping its place when it comes back), holding nothing, until a pass
        wakes it, then `placing` again; past the queue timeout the allocation fails with the last reason it could
        not be placed."""
        assert self.queue_deadline is not None
        self.status.region, self.status.waiting_reason = region, reason
        self.set_state("queued", "enter_queue", region=region, reason=reason)
        self.inbox.woken = False  # a wake from before this entry is answered by the next pass
        entry = EnterQueueInput(
            allocation_id=self.input.allocation_id,
            tenant=self.input.tenant,
            region=region,
            request=self.placement_input(region).request,
            ticket=self.queue_ticket(),
            deadline_at=self.queue_deadline,
            reason=reason,
            code=code,
        )
        await self.on_control(steps.enter_queue, entry)
        self.in_queue = True
        left = (self.queue_deadline - workflow.now()).total_seconds()
        try:
            await workflow.wait_condition(lambda: self.inbox.woken, timeout=max(left, 0.001))
        except TimeoutError:
            waited = format_duration(self.input.queue.timeout_seconds) if self.input.queue else "its timeout"
            self.set_state("queued", "queue_timeout", region=region, reason=reason)
            await self.leave_queue()
            message = f"queue_timeout: not placed within {waited}; last: {reason}"
            raise ApplicationError(message, type=QUEUE_TIMEOUT, non_retryable=True) from None
        if self.fruitless >= 2:  # woken (or placed) in vain again and again: never a busy loop, whatever the cause
            await workflow.sleep(min(2.0**self.fruitless, 60.0))
        self.status.waiting_reason = None
        self.set_state("placing", "woken", region=region)  # a pass set a node aside: decide again

    def accept_region(self, choice: RegionChoice) -> str:
        """The region level's answer: the region, or the allocation's failure with the explanation."""
        if choice.region is None:
            kind = QUOTA_EXCEEDED if choice.refusal_code == "quota_exceeded" else PLACEMENT_REFUSED
            explanation = choice.explanation.model_dump(mode="json") if choice.explanation else None
            raise ApplicationError(choice.reason, explanation, type=kind, non_retryable=True)
        self.status.region = choice.region
        return choice.region

    async def find_candidates(self, region: str) -> list[Candidate]:
        """The re-plan: the cluster level alone, on a fresh snapshot of the chosen region."""
        self.clock.restart()  # a new list: compensating the last attempt had its own bounds
        try:
            found = await self.on_control(
                steps.find_candidates, self.placement_input(region), deadline=self.clock.time_left()
            )
        except AttemptFailed as failure:
            raise failure.ending() from failure
        return self.accept_candidates(found)

    def accept_candidates(self, found: CandidateList) -> list[Candidate]:
        """The cluster level's answer: the candidates, or (before any attempt) the allocation's failure."""
        self.pool_deadlines.update(found.deadlines)
        self.pool_max_leases.update(found.max_leases)
        if found.refusal_code is not None and not self.status.attempts:
            explanation = found.explanation.model_dump(mode="json") if found.explanation else None
            raise ApplicationError(found.reason, explanation, type=PLACEMENT_REFUSED, non_retryable=True)
        return found.candidates

    async def place(self, region: str, first: list[Candidate]) -> None:
        """Try the ranked candidates in order (`first`: the list found with the region); when the list runs out,
        re-plan once on a fresh snapshot."""
        for plan_round in range(2):
            if plan_round == 0:
                candidates = first
            else:
                self.set_state("placing", "find_candidates", region=region)
                candidates = await self.find_candidates(region)
            for candidate in candidates:
                if candidate.node in self.tried or candidate.node in self.excluded:
                    continue  # excluded by an operator's retry since the list was made
                self.tried.add(candidate.node)
                if await self.try_candidate(candidate):
                    return
        attempts = "; ".join(f"{a.node}: {a.reason}" for a in self.status.attempts) or "no candidate node was left"
        raise ApplicationError(
            f"sku_unavailable: {self.input.request.describe()} could not be placed in {region} ({attempts})",
            [a.model_dump(mode="json") for a in self.status.attempts],
            type=SKU_UNAVAILABLE,
            non_retryable=True,
        )

    # -- 3 again: off a failed GPU ------------------------------------------------------------------------------

    async def move_off_failed_gpu(self) -> None:
        """Its pool replaces an allocation whose GPU failed (`onGpuFailure: Replace`): the VM is destroyed
        and its slots wiped as on any release, the claims released, and step 3 runs again on another node, keeping
        the allocation's end. Nothing fits: it waits in its region's queue if it may, else it fails with the reason."""
        notice, attempt = self.inbox.replacement, self.status.attempts[-1]
        assert notice is not None
        self.inbox.replacement = None
        self.tell_owner()  # told first (`degraded`), when the notice came while the hold wrote its trail
        region = self.status.region or ""
        attempt.outcome, attempt.reason = "failed", f"the GPU of slot {notice.slot} failed: {notice.reason}"
        self.excluded.add(attempt.node)
        # The attempt's end in the trail as every failed attempt's (`attempt_failed`): the API rebuilds attempts from
        # the trail when the workflow does not answer its query. The same state as the step after it: no command more.
        self.set_state("placing", "attempt_failed", node=attempt.node, attempt=attempt, reason=attempt.reason)
        self.set_state(
            "placing",
            "replace",
            node=attempt.node,
            attempt=attempt,
            reason=f"moving off {attempt.node}: its VM is destroyed and its slots wiped, then it is placed "
            "again on a healthy node, keeping its end",
        )
        slots = [b.slot_index for b in self.status.bundles]
        await shielded(self.destroy_vm(attempt.node, attempt.number, slots, deadline=self.clock.time_left()))
        await shielded(self.release_claims(attempt.number))
        self.status.node = self.status.pool = None
        self.status.bundles = []
        first = await self.find_candidates(region)
        while not await self.place_or_wait(region, first):
            region, first = await self.choose_placement(woken=True)
        if not self.holds_itself():
            await self.continue_into_hold()

    def placement_input(self, region: str) -> FindCandidatesInput:
        # A per-allocation seed rotates equally ranked nodes, so a burst of identical requests fans out.
        seed = self.input.request.seed
        seed = zlib.crc32(self.input.allocation_id.encode()) if seed is None else seed
        excluded = frozenset(self.excluded | self.tried)
        request = self.input.request.model_copy(update={"exclude_nodes": excluded, "seed": seed})
        return FindCandidatesInput(allocation_id=self.input.allocation_id, request=request, region=region)


__all__ = ["FINAL_STATES", "AllocationWorkflow"]
