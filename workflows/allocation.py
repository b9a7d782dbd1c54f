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

Every state change is mirrored to PostgreSQL (the allocation's row and its events) and to the Temporal UI
(workflows/allocation_mirror.py); each state has a deadline (workflows/state_deadlines.py). Control steps run as
local activities on the worker that runs the workflow: no task-queue round trip, no activity task on the server.
Compensations run even when the workflow is being cancelled, and a node that cannot be reached for teardown gets
its slots quarantined rather than blocking the allocation forever.

Revisions (`AllocationInput.revision`, workflows/allocation_messages.py): a run keeps the revision it started with.
The code keeps the current revision and the previous one; a placement phase drains within its per-state deadlines,
and a held allocation of an older revision is handed over to a hold run on an operator's `hand_over` signal before
an upgrade drops its revision (docs/design.md, "Upgrading").
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import (
        CandidateList,
        ClaimInput,
        DrainNotice,
        EnterQueueInput,
        FindCandidatesInput,
        HealthNotice,
        LeaseRef,
        LeaveQueueInput,
        PlanInput,
        PreemptNotice,
        QuarantineInput,
        QueueTicket,
        ReadinessInput,
        RegionChoice,
        ReleaseClaimsInput,
        TeardownInput,
        VmSpec,
    )
    from fleet.deadlines import format_duration
    from scheduler.placement.nodes import Candidate
    from workflows import node_calls
    from workflows import search_attributes as sa
    from workflows.allocation_failures import (
        PLACEMENT_REFUSED,
        QUEUE_TIMEOUT,
        QUOTA_EXCEEDED,
        SKU_UNAVAILABLE,
        AttemptFailed,
        node_failure,
        past_overall_timeout,
    )
    from workflows.allocation_messages import (
        END_WITH_ACTIVE,
        FINAL_STATES,
        HOLD_IN_PLACEMENT_RUN,
        HOLDING_STATES,
        PLACING_STATES,
        RELEASING_WRITTEN_FIRST,
        AllocationInput,
        AllocationStatus,
        Attempt,
        ExtendRequest,
        HandOverRequest,
        Held,
        ReleaseRequest,
        RetryAccepted,
        RetryRequest,
    )
    from workflows.allocation_mirror import Mirror, search_attributes_of
    from workflows.cancellation import wait_unless_cancelled
    from workflows.recovery import SlotRecoveryInput, SlotRecoveryWorkflow
    from workflows.saga import Saga, shielded
    from workflows.state_deadlines import StateClock

R = TypeVar("R")


CREATE_VM_TIMEOUT = timedelta(minutes=5)
CREATE_VM_ATTEMPTS = 3
REPLACE = ("placing", "replace")  # the hold's ending when its pool replaces it off a failed GPU
HAND_OVER = ("active", "hand_over")  # the hold's ending when it goes on in a fresh run (its history grew long)


@workflow.defn(name="Allocation")
class AllocationWorkflow:
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
        self.excluded: set[str] = set(input.request.exclude_nodes)
        self.tried: set[str] = set()  # never the same node twice in one run
        self.retry_requested = False
        self.release_requested = False
        self.mirror = Mirror(input, self.status)
        deadlines = held.deadlines if held is not None else input.timing.deadlines
        self.clock = StateClock(
            lambda: self.status.state, deadlines, timedelta(seconds=input.timing.agent_pickup_seconds)
        )
        self.pool_deadlines: dict[str, dict[str, float]] = {}
        self.final_recorded = False  # the placement step refused and recorded the final step itself
        self.queue_deadline = (
            workflow.now() + timedelta(seconds=input.queue.timeout_seconds) if input.queue is not None else None
        )
        self.woken = False  # an admission pass set a node aside for it: place again
        self.in_queue = False  # its entry is in the region's queue (the placement step takes it out when it places)
        self.fruitless = 0  # times it was woken (or placed) and could not be placed after all
        self.pool_max_leases: dict[str, float] = {}  # pool -> its maxLease in seconds, of the candidates seen
        self.active_since = held.active_since if held is not None else None
        self.max_lease = held.max_lease_seconds if held is not None else None
        self.end_moved = False  # an extension came: the hold re-reads the end
        self.notice: PreemptNotice | None = None  # told to leave for a queued request (issue 26)
        # What its owner must be told while it holds (issue 27): (state to take, None to keep; step; reason).
        self.untold: list[tuple[str | None, str, str]] = []
        self.replacement: HealthNotice | None = None  # its pool replaces it off a failed GPU (`onGpuFailure`)
        self.hand_over_asked: HandOverRequest | None = None  # an operator asked the hold to go on in a fresh run

    # -- the flow ---------------------------------------------------------------------------------------------------

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
        self.woken = False  # a wake from before this entry is answered by the next pass
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
            await workflow.wait_condition(lambda: self.woken, timeout=max(left, 0.001))
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

    async def leave_queue(self) -> None:
        """Out of the region's queue (timed out, cancelled, refused for good), if it is in one; a StrictFIFO queue
        may let those behind it pass now, so the step walks the queue again."""
        if self.in_queue:
            leave = LeaveQueueInput(allocation_id=self.input.allocation_id, region=self.status.region)
            await self.on_control(steps.leave_queue, leave)
            self.in_queue = False

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

    async def try_candidate(self, candidate: Candidate) -> bool:
        """Run one attempt, racing it against an operator's `retry`; compensate whatever it leaves undone."""
        attempt = Attempt(number=len(self.status.attempts) + 1, node=candidate.node, pool=candidate.pool)
        self.clock.deadlines = self.input.timing.deadlines.with_overrides(self.pool_deadlines.get(candidate.pool, {}))
        self.status.attempts.append(attempt)
        self.status.node, self.status.pool = candidate.node, candidate.pool
        saga = Saga()
        self.retry_requested = False
        running = asyncio.ensure_future(self.attempt(attempt, saga))
        retry = asyncio.ensure_future(workflow.wait_condition(lambda: self.retry_requested))
        try:
            await workflow.wait([running, retry], return_when=asyncio.FIRST_COMPLETED)
            if running.done():
                running.result()  # raises the attempt's failure, if any
                return True
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            raise AttemptFailed("operator_retry", "abandoned by an operator's retry")
        except AttemptFailed as failure:
            attempt.outcome = "abandoned" if failure.code == "operator_retry" else "failed"
            attempt.reason = failure.reason
            # A failure that ends the allocation keeps its state while it compensates: there is no next candidate.
            state = self.status.state if failure.final else "placing"
            self.set_state(state, "attempt_failed", node=candidate.node, attempt=attempt, reason=attempt.reason)
            await saga.compensate()
            self.status.node = self.status.pool = None
            self.status.bundles = []
            if failure.final:
                raise failure.ending() from failure
            return False
        except GeneratorExit:
            raise  # the worker is dropping this run from memory; it resumes from its history, undo included
        except BaseException:
            # Cancellation (or a failure of the whole request): stop the attempt, then undo it.
            attempt.outcome = "cancelled"
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await saga.compensate()
            raise
        finally:
            retry.cancel()

    async def attempt(self, attempt: Attempt, saga: Saga) -> None:
        """Step 3 on one node: plan under the node's lease, claim, create the VM, wait until it is ready."""
        node, request, allocation_id = attempt.node, self.input.request, self.input.allocation_id
        self.set_state("planning", "plan_bundles", node=node, attempt=attempt)
        asked = PlanInput(
            allocation_id=allocation_id,
            attempt=attempt.number,
            gpu_count=request.gpu_count,
            shape=request.shape,
            numa_policy=request.numa_policy,
            gpus=sorted(request.gpus),
        )
        try:
            plan = await self.on_node(node, steps.plan_bundles, asked, deadline=self.clock.time_left(node))
        except ActivityError as error:
            raise self.clock.failure_on(error, node) from error
        if plan.refusal_code is not None:
            raise AttemptFailed(plan.refusal_code, plan.refusal_message or "the node refused the plan")
        saga.add("release_lease", lambda: self.release_lease(node))

        self.set_state("claiming", "record_claims", node=node, attempt=attempt)
        claim = ClaimInput(
            allocation_id=allocation_id,
            attempt=attempt.number,
            node=node,
            tenant=self.input.tenant,
            gpu_count=request.gpu_count,
            bundles=plan.bundles,
            within_nominal=request.within_nominal,
        )
        try:
            await self.on_control(steps.record_claims, claim, deadline=self.clock.time_left(node))
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.type == "QuotaExceeded":
                # The attempt failed, with the reason, then the allocation.
                raise AttemptFailed("quota_exceeded", cause.message, final=QUOTA_EXCEEDED) from error
            if isinstance(cause, ApplicationError) and cause.type == "ClaimConflict":
                raise AttemptFailed("claim_conflict", cause.message) from error
            raise
        saga.add("release_claims", lambda: self.release_claims(attempt.number))
        self.status.bundles = plan.bundles

        self.set_state("provisioning", "create_vm", node=node, attempt=attempt)
        # Registered before the create: a create cut short by a failure or a cancel may still have made a VM.
        saga.add("destroy_vm", lambda: self.destroy_vm(node, attempt.number, plan.slot_indexes))
        spec = VmSpec(
            allocation_id=allocation_id,
            node=node,
            bundles=plan.bundles,
            image=self.input.image,
            ssh_public_keys=self.input.ssh_public_keys,
        )
        create = self.on_node(
            node,
            steps.create_vm,
            spec,
            start_to_close=CREATE_VM_TIMEOUT,
            attempts=CREATE_VM_ATTEMPTS,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        try:
            await self.clock.race(node, create, self.clock.longest_node_call(CREATE_VM_TIMEOUT, CREATE_VM_ATTEMPTS))
        except ActivityError as error:
            raise node_failure(error, node) from error

        self.set_state("waiting_ready", "wait_ready", node=node, attempt=attempt)
        await self.wait_until_ready(node)
        attempt.outcome = "succeeded"
        self.begin_lease(attempt.pool)
        ends_at = self.status.ends_at
        if self.input.revision >= END_WITH_ACTIVE:  # the end rides with `active`: one upsert, not two
            ends = self.mirror.end_values(ends_at, expiring=False)
            self.set_state("active", "ready", node=node, attempt=attempt, ends_at=ends_at, also=ends)
        else:
            self.set_state("active", "ready", node=node, attempt=attempt, ends_at=ends_at)
            self.mirror.publish_end(ends_at, expiring=False)

    async def wait_until_ready(self, node: str) -> None:
        """Probe the readiness gates a window at a time until every gate passes; a gate that failed for good, or no
        readiness within the node's timeout, fails the attempt; past the state's deadline, the allocation."""
        timing = self.input.timing
        probe = ReadinessInput(
            allocation_id=self.input.allocation_id,
            node=node,
            gpu_count=self.input.request.gpu_count,
            window_seconds=timing.readiness_window_seconds,
        )
        give_up = workflow.now() + timedelta(seconds=timing.readiness_timeout_seconds)
        while True:
            try:
                report = await self.on_node(
                    node,
                    steps.wait_ready,
                    probe,
                    deadline=self.clock.time_left(node),
                    start_to_close=timedelta(seconds=timing.readiness_window_seconds + 30),
                )
            except ActivityError as error:
                raise self.clock.failure_on(error, node) from error
            if report.ready:
                return
            if self.mirror.published.get(sa.STATE.name) != "waiting_ready":
                # Not ready at the first look: this boot takes a while, so the UI and the audit trail show the wait
                # (a boot that is ready at once never pays for either).
                self.mirror.publish(self.mirror.search_values("waiting_ready"))
                await self.mirror.write_trail()
            if report.failed_gate is not None:  # failed for good: no point waiting out the timeout
                raise AttemptFailed("readiness_failed", f"{report.failed_gate}: {report.failure or 'failed'}")
            remaining = (give_up - workflow.now()).total_seconds()
            if remaining <= 0:
                raise AttemptFailed(
                    "readiness_timeout",
                    f"not ready after {timing.readiness_timeout_seconds:g}s: waiting for {', '.join(report.pending())}",
                )
            left = self.clock.time_left(node)  # past the state's deadline: the allocation fails
            pause = min(timing.readiness_poll_seconds, remaining)
            await workflow.sleep(pause if left is None else min(pause, left.total_seconds()))

    # -- the hold (step 4) ------------------------------------------------------------------------------------------

    def holds_itself(self) -> bool:
        """Revision 4 on: the run that places the allocation holds it too, so its page in the Temporal UI tells the
        whole story and `active` is answered at once. Before, the placement run continued as new at `active`, and
        Temporal's minimum interval between runs (1 s by default) kept the hold run from answering meanwhile."""
        return self.input.revision >= HOLD_IN_PLACEMENT_RUN

    async def continue_into_hold(self) -> None:
        """Revisions 2 and 3: hand the active allocation to a fresh run that only holds it. A release taken while this
        run finished its work is served here instead, and so is a cancellation (one the SDK swallowed included: the
        hold run would never hear of it)."""
        await self.mirror.write_trail()
        await wait_unless_cancelled(workflow.all_handlers_finished)
        if self.release_requested:
            return
        held = Held(
            status=self.status,
            deadlines=self.clock.deadlines,
            active_since=self.active_since,
            max_lease_seconds=self.max_lease,
        )
        workflow.continue_as_new(self.input.model_copy(update={"held": held}))

    def hand_over_due(self) -> str | None:
        """Why the hold should go on in a fresh run now, or None. Its history reached `Timing.hold_history_events`
        (or Temporal suggests it: a history too long to keep replaying), or an operator asked (`hand_over`, before
        an upgrade that drops this run's revision). A release or a preemption under way is served first."""
        if not self.holds_itself() or self.release_requested or self.notice is not None:
            return None
        info, limit = workflow.info(), self.input.timing.hold_history_events
        if self.hand_over_asked is not None:
            return f"asked: {self.hand_over_asked.reason or 'an operator asked'}"
        if info.is_continue_as_new_suggested():
            return "Temporal suggested it: the history is long"
        if info.get_current_history_length() >= limit:
            return f"its history reached {limit} events"
        return None

    async def hand_over(self) -> None:
        """Go on holding in a fresh run (continue-as-new) whose input carries the allocation (node, bundles,
        attempts, end) and says which run it continues. This run's search attributes are unset before it closes, so
        a filter on state, region, node or tenant lists the allocation once: by its open run. Returns, holding on
        here, when a release or a preemption came while it wrote its trail."""
        because = self.hand_over_due()
        assert because is not None
        self.set_state(self.status.state, "hand_over", reason=f"the hold goes on in a fresh run: {because}")
        await wait_unless_cancelled(workflow.all_handlers_finished)
        while self.mirror.trail:  # a handler's step written too, before the run closes
            await self.mirror.write_trail()
            await wait_unless_cancelled(workflow.all_handlers_finished)
        if self.hand_over_due() is None:
            return  # released or preempted meanwhile: served here
        held = Held(
            status=self.status,
            deadlines=self.clock.deadlines,
            active_since=self.active_since,
            max_lease_seconds=self.max_lease,
            previous_run_id=workflow.info().run_id,
            handed_over_because=because,
        )
        workflow.upsert_search_attributes([key.value_unset() for key in sa.ALL])
        workflow.continue_as_new(
            self.input.model_copy(update={"held": held}),
            search_attributes=search_attributes_of(self.input, self.status, self.mirror.published),
        )

    def begin_lease(self, pool: str) -> None:
        """Active now: the end it asked for (`duration_seconds` from now, or `ends_at`), else its pool's `maxLease`
        from now, else none. The pool's maximum was checked when the pool was chosen (`scheduler.placement.pools`)."""
        if self.active_since is not None:
            return  # placed again off a failed GPU: it keeps the lease it had
        now = workflow.now()
        self.active_since, self.max_lease = now, self.pool_max_leases.get(pool)
        lease = self.input.lease
        if lease is not None and lease.ends_at is not None:
            self.status.ends_at = lease.ends_at
        elif lease is not None and lease.duration_seconds is not None:
            self.status.ends_at = now + timedelta(seconds=lease.duration_seconds)
        elif self.max_lease is not None:
            self.status.ends_at = now + timedelta(seconds=self.max_lease)

    async def hold_until_released(self) -> tuple[str, str]:
        """Hold until a release or, for an allocation with an end, the end (`expired`); its owner is warned
        `Timing.expiry_warning_seconds` before it. An extension moves the end and the warning with it."""
        while True:
            await self.mirror.write_trail()
            if self.replacement is not None:
                return REPLACE
            if self.hand_over_due() is not None:
                return HAND_OVER
            ends_at = self.status.ends_at
            if ends_at is None:
                await wait_unless_cancelled(self.interrupted)
                if self.tell_owner():
                    continue
                if self.release_requested:
                    return "released", "release"
                if self.notice is None:
                    continue  # a hand-over is due: the loop's top
                return await self.serve_notice()
            warn_at = ends_at - timedelta(seconds=self.input.timing.expiry_warning_seconds)
            now = workflow.now()
            if now >= ends_at:
                return "expired", "expire"
            if now >= warn_at and not self.status.expiry_warned:
                self.warn_of_end(ends_at)
                continue
            instant = ends_at if self.status.expiry_warned else warn_at
            self.end_moved = False
            try:
                await wait_unless_cancelled(self.interrupted, instant - now)
            except TimeoutError:
                continue
            if self.tell_owner():
                continue
            if self.release_requested:
                return "released", "release"
            if self.notice is not None:
                return await self.serve_notice()

    async def move_off_failed_gpu(self) -> None:
        """Its pool replaces an allocation whose GPU failed (`onGpuFailure: Replace`, issue 27): the VM is destroyed
        and its slots wiped as on any release, the claims released, and step 3 runs again on another node, keeping
        the allocation's end. Nothing fits: it waits in its region's queue if it may, else it fails with the reason."""
        notice, attempt = self.replacement, self.status.attempts[-1]
        assert notice is not None
        self.replacement = None
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

    def interrupted(self) -> bool:
        return (
            self.release_requested
            or self.end_moved
            or self.notice is not None
            or bool(self.untold)
            or self.hand_over_due() is not None
        )

    def tell_owner(self) -> bool:
        """Record what its owner must be told (issue 27): a failed GPU (`degraded`) or its node being drained. It
        keeps running, as its owner decides: the event, the state and the Temporal UI say why. True when something
        was told now (the hold then writes the trail)."""
        told, self.untold = self.untold, []
        for state, step, reason in told:
            self.set_state(state or self.status.state, step, reason=reason)
        return bool(told)

    async def serve_notice(self) -> tuple[str, str]:
        """Preempted (issue 26): `preempting` for the grace period its PriorityClass gives, then the release saga,
        final state `preempted`. Its owner sees the preemptor's priority, never its tenant; a release meanwhile
        ends it at once, as `released`."""
        notice = self.notice
        assert notice is not None
        of = f" (class {notice.priority_class})" if notice.priority_class else ""
        reason = (
            f"preempted for a request of priority {notice.priority}{of} ({notice.rule}); released after "
            f"{format_duration(notice.grace_seconds)}"
        )
        self.set_state("preempting", "preempt_notice", reason=reason)
        await self.mirror.write_trail()
        try:
            await wait_unless_cancelled(lambda: self.release_requested, timedelta(seconds=notice.grace_seconds))
        except TimeoutError:
            return "preempted", "preempt"
        return "released", "release"

    def warn_of_end(self, ends_at: datetime) -> None:
        """`expiring`: the owner sees it in the allocation's events, `berth alloc get` and the Temporal UI."""
        self.status.expiry_warned = True
        self.set_state(self.status.state, "expiring", reason=f"ends at {ends_at.isoformat()}; extend it to keep it")
        self.mirror.publish_end(ends_at, expiring=True)

    async def teardown(self, final_state: str, step: str) -> None:
        """Give everything back: destroy the VM and wipe its slots, release the claims. Runs to completion even
        when the workflow is being cancelled.

        Since revision 5 the row says `releasing` before the host's part starts, and the final state is written
        with the release of the claims, in its transaction: the row is never `active` while the VM goes, nor final
        while its GPUs are still claimed, and the release costs no more actions than before."""
        await self.leave_queue()  # cancelled while waiting: nothing is held, only the queue's entry
        if self.status.state in HOLDING_STATES:
            self.set_state("releasing", step)
            written_first = self.input.revision >= RELEASING_WRITTEN_FIRST
            if written_first:
                await self.mirror.write_trail()  # the row says `releasing` while the host's part runs
            attempt = self.status.attempts[-1]
            await self.destroy_vm(
                attempt.node,
                attempt.number,
                [b.slot_index for b in self.status.bundles],
                deadline=self.clock.time_left(),
            )
            if written_first:
                self.status.bundles = []
                self.set_state(final_state, final_state)  # rides with the release of the claims
            await self.release_claims(None)
        self.status.bundles = []
        if self.status.state != final_state:
            self.set_state(final_state, final_state)
        await self.mirror.write_trail()  # nothing left to write when the final state rode with the release

    # -- control and node calls, compensations ------------------------------------------------------------------------

    async def on_control(
        self, step: Callable[[Any], Awaitable[R]], argument: BaseModel, *, deadline: timedelta | None = None
    ) -> R:
        """Run a control step with the unwritten audit trail (workflows/allocation_mirror.py). `deadline`: what is
        left of the state's deadline; past it, with every retry, the state's deadline has passed."""
        try:
            return await self.mirror.control_step(step, argument, deadline)
        except ActivityError as error:
            if deadline is not None and past_overall_timeout(error):
                raise self.clock.passed(self.status.node) from error
            raise

    async def on_node(self, node: str, step: Callable[[Any], R], argument: BaseModel, **options: Any) -> R:
        """A node step on the node's agent, with this allocation's pickup timeout (workflows/node_calls.py)."""
        pickup = timedelta(seconds=self.input.timing.agent_pickup_seconds)
        return await node_calls.on_node(self.input.queues, node, step, argument, pickup=pickup, **options)

    async def release_lease(self, node: str) -> None:
        try:
            await self.on_node(node, steps.release_lease, LeaseRef(allocation_id=self.input.allocation_id, node=node))
        except ActivityError:
            pass  # an unreachable agent cannot free its lease; the lease expires and the agent reaps it

    async def release_claims(self, attempt: int | None) -> None:
        """6: the step that frees the capacity walks the region's queue too."""
        release = ReleaseClaimsInput(
            allocation_id=self.input.allocation_id, attempt=attempt, walk_region=self.status.region
        )
        await self.on_control(steps.release_claims, release)

    async def destroy_vm(
        self, node: str, attempt: int, slot_indexes: list[int], *, deadline: timedelta | None = None
    ) -> None:
        """Destroy and wipe on the node; if the node cannot be reached, or not within `deadline` (a release's),
        quarantine its slots and leave a recovery workflow waiting for the agent to come back and confirm the wipe."""
        teardown = TeardownInput(allocation_id=self.input.allocation_id, node=node, slot_indexes=slot_indexes)
        try:
            await self.on_node(
                node,
                steps.destroy_vm,
                teardown,
                attempts=self.input.timing.teardown_attempts,
                start_to_close=timedelta(minutes=2),
                deadline=deadline,
            )
            return
        except ActivityError as error:
            failure = self.clock.failure_on(error, node) if deadline is not None else node_failure(error, node)
        quarantine = QuarantineInput(
            allocation_id=self.input.allocation_id,
            attempt=attempt,
            node=node,
            slot_indexes=slot_indexes,
            reason=f"wipe not confirmed: {failure.reason}",
        )
        await self.on_control(steps.quarantine_slots, quarantine)
        await workflow.start_child_workflow(
            SlotRecoveryWorkflow.run,
            SlotRecoveryInput(teardown=teardown, queues=self.input.queues),
            id=f"recovery/{node}/{self.input.allocation_id}/{attempt}",
            task_queue=self.input.queues.control,
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"wipe {len(slot_indexes)} slot(s) of {node} when its agent returns",
        )

    # -- state, UI and audit ----------------------------------------------------------------------------------------

    def placement_input(self, region: str) -> FindCandidatesInput:
        # A per-allocation seed rotates equally ranked nodes, so a burst of identical requests fans out.
        seed = self.input.request.seed
        seed = zlib.crc32(self.input.allocation_id.encode()) if seed is None else seed
        excluded = frozenset(self.excluded | self.tried)
        request = self.input.request.model_copy(update={"exclude_nodes": excluded, "seed": seed})
        return FindCandidatesInput(allocation_id=self.input.allocation_id, request=request, region=region)

    def set_state(self, state: str, step: str, **details: Any) -> None:
        """Move to a state: its deadline's clock, and what the world sees of it (workflows/allocation_mirror.py)."""
        if state != self.status.state:
            self.clock.restart()
        self.mirror.move(state, step, **details)

    # -- operator messages ------------------------------------------------------------------------------------------

    @workflow.query
    def status_query(self) -> AllocationStatus:
        return self.status

    @workflow.signal(name="wake")
    def wake(self) -> None:
        """An admission pass set a node aside for this queued request (activities/control/admission.py)."""
        self.woken = True

    @workflow.signal(name="preempt")
    def preempt(self, notice: PreemptNotice) -> None:
        """An admission pass chose this active allocation to make room for a queued request; a second notice (sent
        again after a lost one) changes nothing."""
        if self.status.state in ("active", "degraded") and self.notice is None:
            self.notice = notice

    @workflow.signal(name="gpu_failed")
    def gpu_failed(self, notice: HealthNotice) -> None:
        """Its agent judged a GPU of one of its slots failed (issue 27; sent by the API on the agent's report). Told
        once: a second notice while degraded changes nothing."""
        if self.status.state == "active" and not any(step == "gpu_failed" for _, step, _ in self.untold):
            then = (
                "its pool moves it to a healthy node"
                if notice.replace
                else "the allocation keeps running: release it and ask again for healthy GPUs"
            )
            self.untold.append(
                ("degraded", "gpu_failed", f"the GPU of slot {notice.slot} failed ({notice.reason}); {then}")
            )
            if notice.replace:
                self.replacement = notice

    @workflow.signal(name="drain")
    def drain(self, notice: DrainNotice) -> None:
        """An operator drains its node (`berth nodes drain`): its owner is told, it keeps running until released."""
        if self.status.state in ("active", "degraded") and not self.status.drain_told:
            self.status.drain_told = True
            self.untold.append(
                (
                    None,
                    "drain_notice",
                    f"node {notice.node} is being drained ({notice.reason}): "
                    "release this allocation and ask again; it keeps running until then",
                )
            )

    @workflow.signal(name="hand_over")
    def hand_over_signal(self, request: HandOverRequest) -> None:
        """Go on holding in a fresh run (revision 4 on; a run still being placed does so once active). Sent to every
        held allocation of a revision before an upgrade drops its branches (docs/design.md, "Upgrading")."""
        if self.hand_over_asked is None:
            self.hand_over_asked = request

    @workflow.update
    async def retry(self, request: RetryRequest) -> RetryAccepted:
        """Abandon the running attempt (compensating it) and go on with the next candidate."""
        self.excluded |= set(request.exclude_nodes)
        abandoned = self.status.node
        self.retry_requested = True
        return RetryAccepted(abandoned_node=abandoned, excluded_nodes=sorted(self.excluded))

    @retry.validator
    def validate_retry(self, request: RetryRequest) -> None:
        if self.status.state not in PLACING_STATES:
            raise self.invalid_state("only an allocation being placed can be retried")

    @workflow.update
    async def release(self, request: ReleaseRequest) -> AllocationStatus:
        self.release_requested = True
        return self.status

    @release.validator
    def validate_release(self, request: ReleaseRequest) -> None:
        if self.status.state not in HOLDING_STATES:
            hint = " (cancel it instead)" if self.status.state in (*PLACING_STATES, "queued") else ""
            raise self.invalid_state(f"only an active allocation can be released{hint}")

    @workflow.update
    async def extend(self, request: ExtendRequest) -> AllocationStatus:
        """Move the end later (issue 26): the warning is given again before the new end."""
        ends_at = self.extended_end(request)
        self.status.ends_at, self.status.expiry_warned, self.end_moved = ends_at, False, True
        self.set_state(self.status.state, "extended", reason=f"ends at {ends_at.isoformat()}", ends_at=ends_at)
        self.mirror.publish_end(ends_at, expiring=False)
        return self.status

    @extend.validator
    def validate_extend(self, request: ExtendRequest) -> None:
        if self.status.state not in ("active", "degraded"):
            raise self.invalid_state("only an active allocation can be extended")
        if self.status.ends_at is None:
            raise self.invalid_state("it has no end to extend")
        self.extended_end(request)

    def extended_end(self, request: ExtendRequest) -> datetime:
        """The new end, or the refusal: not later than the current end, past what its node's reservations allow, or past
        the pool's `maxLease`."""
        current = self.status.ends_at
        assert current is not None
        wanted = request.ends_at if request.ends_at is not None else current + timedelta(seconds=request.seconds or 0)
        if wanted <= current:
            raise ApplicationError(
                f"the new end {wanted.isoformat()} is not later than the current end {current.isoformat()}",
                type="ExtendRefused",
                non_retryable=True,
            )
        if request.not_after is not None and wanted > request.not_after:
            raise ApplicationError(
                f"{request.not_after_reason or 'a reservation needs its GPUs'}: it can end at "
                f"{request.not_after.isoformat()} at the latest",
                type="ExtendRefused",
                non_retryable=True,
            )
        if self.max_lease is not None and self.active_since is not None:
            latest = self.active_since + timedelta(seconds=self.max_lease)
            if wanted > latest:
                raise ApplicationError(
                    f"the pool grants leases of at most {format_duration(self.max_lease)}: it can end at "
                    f"{latest.isoformat()} at the latest",
                    type="ExtendRefused",
                    non_retryable=True,
                )
        return wanted

    def invalid_state(self, rule: str) -> ApplicationError:
        """An update refused in this state (a validator's refusal is not recorded in the history); the state travels
        as the failure's detail, so the API answers naming it without reading the words."""
        state = self.status.state
        return ApplicationError(f"allocation is {state}; {rule}", state, type="InvalidState", non_retryable=True)


__all__ = ["FINAL_STATES", "AllocationWorkflow"]
