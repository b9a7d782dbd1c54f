"""Steps 1, 2, 3 and 5 of workflow.py: choose the region and the candidates, wait in the region's queue when the
request may, try the candidates in order (attempt.py tries one), re-plan once when the list runs out, and fail with
every attempt's reason when nothing is left. A failed GPU its pool replaces runs the same steps again from the hold.
"""

from __future__ import annotations

import zlib

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import CandidateList, EnterQueueInput, FindCandidatesInput, QueueTicket, RegionChoice
    from contracts.durations import format_duration
    from contracts.failures import PLACEMENT_REFUSED, QUEUE_TIMEOUT, QUOTA_EXCEEDED, SKU_UNAVAILABLE
    from contracts.placement import Candidate
    from workflows.allocation.attempt import NodeAttempt
    from workflows.allocation.calls import Calls
    from workflows.allocation.failures import AttemptFailed
    from workflows.allocation.state import RunState
    from workflows.saga import shielded


class Placement:
    def __init__(self, state: RunState, calls: Calls, attempt: NodeAttempt) -> None:
        self.state = state
        self.calls = calls
        self.clock = calls.clock
        self.attempt = attempt

    async def place(self) -> None:
        """Steps 1 and 2, then 3 (and 5 when nothing works); a request that may wait goes to its queue between them
        and decides again each time a pass wakes it."""
        region, first = await self.choose_placement()
        while not await self.place_or_wait(region, first):
            region, first = await self.choose_placement(woken=True)

    async def place_or_wait(self, region: str, first: list[Candidate]) -> bool:
        """Step 3; for a request that may wait, every candidate failing for now (another allocation took the slots
        first, say) sends it back to its queue with the reason, rather than failing: False, then woken to decide
        again. Past its queue timeout it fails as any queued request does."""
        try:
            await self.try_candidates(region, first)
            return True
        except ApplicationError as error:
            if error.type != SKU_UNAVAILABLE or self.state.input.queue is None:
                raise
            self.state.tried.clear()  # a new round after the wait: every node may be tried again
            self.state.fruitless += 1
            await self.wait_in_queue(region, error.message, "sku_unavailable")
            return False

    async def choose_placement(self, *, woken: bool = False) -> tuple[str, list[Candidate]]:
        """Steps 1 and 2 as one control step on one snapshot; the trail still records each decision as its step.

        The UI shows `placing` from the run's start (set by the start itself) and learns the region with the next
        state it shows, and the step records a refusal as the allocation's final step: a request refused here costs
        one local activity, one search-attribute upsert (`failed`) and one write.
        `woken`: a queued request deciding again (its state is set already)."""
        state = self.state
        if not woken:
            self.calls.set_state("placing", "select_region", publish=False)
        while True:
            final = self.calls.mirror.state_change("failed", "failed")
            placement = self.placement_input("").model_copy(update={"final": final, "wait": self.queue_ticket()})
            try:
                choice = await self.calls.on_control(steps.choose_placement, placement, deadline=self.clock.time_left())
            except AttemptFailed as failure:
                raise failure.ending() from failure
            if not (choice.waitable and state.input.queue is not None):
                if choice.refusal() is None:
                    state.in_queue = False  # the step took it out of the queue with its first choice
                break
            state.fruitless += 1 if state.status.step == "woken" else 0
            refusal = choice.refusal()
            assert refusal is not None and choice.queue_region is not None
            reason = refusal.refusal_message or refusal.refusal_code or "no room now"
            await self.wait_in_queue(choice.queue_region, reason, refusal.refusal_code or "")
        state.final_recorded = choice.final_recorded  # a refusal: the step recorded its decisions and the end
        region = self.accept_region(choice.region)
        recorded = state.final_recorded
        self.calls.set_state("placing", "find_candidates", region=region, publish=not recorded, recorded=recorded)
        assert choice.candidates is not None  # the region level chose one, so the cluster level ran
        return region, self.accept_candidates(choice.candidates)

    def queue_ticket(self) -> QueueTicket | None:
        """What the placement step needs to know of a request that may wait: its priority, and whether it is in its
        region's queue already."""
        wait = self.state.input.queue
        if wait is None:
            return None
        return QueueTicket(priority=wait.priority, priority_class=wait.priority_class, queued=self.state.in_queue)

    async def wait_in_queue(self, region: str, reason: str, code: str) -> None:
        """Queued: in the region's queue (keeping its place when it comes back), holding nothing, until a pass
        wakes it, then `placing` again; past the queue timeout the allocation fails with the last reason it could
        not be placed."""
        state, input = self.state, self.state.input
        assert state.queue_deadline is not None
        state.status.region, state.status.waiting_reason = region, reason
        self.calls.set_state("queued", "enter_queue", region=region, reason=reason)
        state.inbox.woken = False  # a wake from before this entry is answered by the next pass
        entry = EnterQueueInput(
            allocation_id=input.allocation_id,
            tenant=input.tenant,
            region=region,
            request=self.placement_input(region).request,
            ticket=self.queue_ticket(),
            deadline_at=state.queue_deadline,
            reason=reason,
            code=code,
        )
        await self.calls.on_control(steps.enter_queue, entry)
        state.in_queue = True
        left = (state.queue_deadline - workflow.now()).total_seconds()
        try:
            await workflow.wait_condition(lambda: state.inbox.woken, timeout=max(left, 0.001))
        except TimeoutError:
            waited = format_duration(input.queue.timeout_seconds) if input.queue else "its timeout"
            self.calls.set_state("queued", "queue_timeout", region=region, reason=reason)
            await self.calls.leave_queue()
            message = f"queue_timeout: not placed within {waited}; last: {reason}"
            raise ApplicationError(message, type=QUEUE_TIMEOUT, non_retryable=True) from None
        if state.fruitless >= 2:  # woken (or placed) in vain again and again: never a busy loop, whatever the cause
            await workflow.sleep(min(2.0**state.fruitless, 60.0))
        state.status.waiting_reason = None
        self.calls.set_state("placing", "woken", region=region)  # a pass set a node aside: decide again

    def accept_region(self, choice: RegionChoice) -> str:
        """The region level's answer: the region, or the allocation's failure with the explanation."""
        if choice.region is None:
            kind = QUOTA_EXCEEDED if choice.refusal_code == "quota_exceeded" else PLACEMENT_REFUSED
            explanation = choice.explanation.model_dump(mode="json") if choice.explanation else None
            raise ApplicationError(choice.reason, explanation, type=kind, non_retryable=True)
        self.state.status.region = choice.region
        return choice.region

    async def find_candidates(self, region: str) -> list[Candidate]:
        """The re-plan: the cluster level alone, on a fresh snapshot of the chosen region."""
        self.clock.restart()  # a new list: compensating the last attempt had its own bounds
        try:
            found = await self.calls.on_control(
                steps.find_candidates, self.placement_input(region), deadline=self.clock.time_left()
            )
        except AttemptFailed as failure:
            raise failure.ending() from failure
        return self.accept_candidates(found)

    def accept_candidates(self, found: CandidateList) -> list[Candidate]:
        """The cluster level's answer: the candidates, or (before any attempt) the allocation's failure."""
        self.state.pool_deadlines.update(found.deadlines)
        self.state.pool_max_leases.update(found.max_leases)
        if found.refusal_code is not None and not self.state.status.attempts:
            explanation = found.explanation.model_dump(mode="json") if found.explanation else None
            raise ApplicationError(found.reason, explanation, type=PLACEMENT_REFUSED, non_retryable=True)
        return found.candidates

    async def try_candidates(self, region: str, first: list[Candidate]) -> None:
        """Try the ranked candidates in order (`first`: the list found with the region); when the list runs out,
        re-plan once on a fresh snapshot."""
        state = self.state
        for plan_round in range(2):
            if plan_round == 0:
                candidates = first
            else:
                self.calls.set_state("placing", "find_candidates", region=region)
                candidates = await self.find_candidates(region)
            for candidate in candidates:
                if candidate.node in state.tried or candidate.node in state.excluded:
                    continue  # excluded by an operator's retry since the list was made
                state.tried.add(candidate.node)
                if await self.attempt.try_candidate(candidate):
                    return
        attempts = "; ".join(f"{a.node}: {a.reason}" for a in state.status.attempts) or "no candidate node was left"
        raise ApplicationError(
            f"sku_unavailable: {state.input.request.describe()} could not be placed in {region} ({attempts})",
            [a.model_dump(mode="json") for a in state.status.attempts],
            type=SKU_UNAVAILABLE,
            non_retryable=True,
        )

    async def move_off_failed_gpu(self) -> None:
        """Its pool replaces an allocation whose GPU failed (`onGpuFailure: Replace`): the VM is destroyed
        and its slots wiped as on any release, the claims released, and step 3 runs again on another node, keeping
        the allocation's end. Nothing fits: it waits in its region's queue if it may, else it fails with the reason.
        Its owner has been told already (`degraded`: the hold's `tell_owner`)."""
        state, status = self.state, self.state.status
        notice, attempt = state.inbox.replacement, status.attempts[-1]
        assert notice is not None
        state.inbox.replacement = None
        region = status.region or ""
        attempt.outcome, attempt.reason = "failed", f"the GPU of slot {notice.slot} failed: {notice.reason}"
        state.excluded.add(attempt.node)
        # The attempt's end in the trail as every failed attempt's (`attempt_failed`): the API rebuilds attempts from
        # the trail when the workflow does not answer its query. The same state as the step after it: no command more.
        self.calls.set_state("placing", "attempt_failed", node=attempt.node, attempt=attempt, reason=attempt.reason)
        self.calls.set_state(
            "placing",
            "replace",
            node=attempt.node,
            attempt=attempt,
            reason=f"moving off {attempt.node}: its VM is destroyed and its slots wiped, then it is placed "
            "again on a healthy node, keeping its end",
        )
        slots = [b.slot_index for b in status.bundles]
        await shielded(self.calls.destroy_vm(attempt.node, attempt.number, slots, deadline=self.clock.time_left()))
        await shielded(self.calls.release_claims(attempt.number))
        status.node = status.pool = None
        status.bundles = []
        first = await self.find_candidates(region)
        while not await self.place_or_wait(region, first):
            region, first = await self.choose_placement(woken=True)

    def placement_input(self, region: str) -> FindCandidatesInput:
        # A per-allocation seed rotates equally ranked nodes, so a burst of identical requests fans out.
        input = self.state.input
        seed = input.request.seed
        seed = zlib.crc32(input.allocation_id.encode()) if seed is None else seed
        excluded = frozenset(self.state.excluded | self.state.tried)
        request = input.request.model_copy(update={"exclude_nodes": excluded, "seed": seed})
        return FindCandidatesInput(allocation_id=input.allocation_id, request=request, region=region)
