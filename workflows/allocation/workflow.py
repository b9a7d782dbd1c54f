"""The allocation workflow: the hierarchical placement, made durable (docs/design.md section 2; docs/seeds.md, "Four
layers, each deciding only what it knows" and "Next node, or a refusal with the topology's reason").

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

This class is the run: it makes the run's state (state.py, one `RunState` every part holds) and its parts, and goes
through the steps above with them: the placement, 1, 2, 3 and 5 (placement.py), which tries each candidate with
the attempt (attempt.py); the hold, 4 (hold.py); the answers to messages (handlers.py, declared to Temporal here);
and what they all stand on: the calls out and the compensations, 6 (calls.py), what the world sees (mirror.py) and
each state's deadline (deadlines.py).

Control steps run as local activities on the worker that runs the workflow: no task-queue round trip, no activity
task on the server. Compensations run even when the workflow is being cancelled, and a node that cannot be reached
for teardown gets its slots quarantined rather than blocking the allocation forever.

Revisions (revisions.py): a run keeps the revision it started with, and this code runs the current revision and the
one before it. A run of an older one is refused before it takes a step: an upgrade hands such runs over to a fresh
run of the current revision, or waits for them to end, before it deploys (docs/design.md, "Upgrading the allocation
workflow").
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from contracts.allocation import FINAL_STATES, DrainNotice, HealthNotice, PreemptNotice
    from workflows.allocation.attempt import NodeAttempt
    from workflows.allocation.calls import Calls
    from workflows.allocation.deadlines import StateClock
    from workflows.allocation.handlers import Messages
    from workflows.allocation.hold import HAND_OVER, REPLACE, Hold
    from workflows.allocation.messages import (
        AllocationInput,
        AllocationStatus,
        ExtendRequest,
        HandOverRequest,
        ReleaseRequest,
        RetryAccepted,
        RetryRequest,
    )
    from workflows.allocation.mirror import Mirror
    from workflows.allocation.placement import Placement
    from workflows.allocation.revisions import retired
    from workflows.allocation.state import RunState
    from workflows.saga import shielded


class RetiredRevision(RuntimeError):
    """A run of a revision this code no longer runs (revisions.py, `retired`)."""


@workflow.defn(name="Allocation")
class AllocationWorkflow:
    @workflow.init
    def __init__(self, input: AllocationInput) -> None:
        self.state = RunState.begin(input)
        self.mirror = Mirror(self.state)
        self.calls = Calls(self.state, self.mirror, StateClock(self.state))
        self.placement = Placement(self.state, self.calls, NodeAttempt(self.state, self.calls))
        self.hold = Hold(self.state, self.calls)
        self.messages = Messages(self.state, self.calls)

    @workflow.run
    async def run(self, input: AllocationInput) -> AllocationStatus:
        if (why := retired(input)) is not None:
            # Not a failure of the allocation: the workflow task fails and Temporal tries it again, so the run waits,
            # its history untouched, for a worker that still runs its revision.
            raise RetiredRevision(why)
        placement, hold = self.placement, self.hold
        try:
            if input.held is None:
                self.mirror.open()
                await placement.place()  # 1, 2 (queued between them, if it waits), 3 (and 5 when nothing works)
            workflow.set_current_details(self.mirror.story())
            ending = await hold.hold_until_released()  # 4
            while ending in (REPLACE, HAND_OVER):
                if ending == HAND_OVER:
                    await hold.hand_over()  # continues as new, unless a release or a notice came meanwhile
                else:
                    hold.tell_owner()  # told first (`degraded`), when the notice came while the hold wrote its trail
                    await placement.move_off_failed_gpu()  # 3 again, on a healthy node, then the hold goes on
                ending = await hold.hold_until_released()
            await shielded(hold.teardown(*ending))
        except BaseException as error:
            if is_cancelled_exception(error) and self.state.status.state not in FINAL_STATES:
                await shielded(hold.teardown("cancelled", "cancel"))
            elif isinstance(error, ApplicationError):
                await shielded(self.calls.leave_queue())  # refused for good after a wake: the entry goes
                recorded = self.state.final_recorded
                self.calls.set_state("failed", "failed", reason=error.message, recorded=recorded)
                await shielded(self.mirror.write_trail())
            raise
        return self.state.status

    # -- messages: declared here, answered by handlers.py -------------------------------------------------------------

    @workflow.query
    def status_query(self) -> AllocationStatus:
        return self.state.status

    @workflow.signal(name="wake")
    def wake(self) -> None:
        self.messages.wake()

    @workflow.signal(name="preempt")
    def preempt(self, notice: PreemptNotice) -> None:
        self.messages.preempt(notice)

    @workflow.signal(name="gpu_failed")
    def gpu_failed(self, notice: HealthNotice) -> None:
        self.messages.gpu_failed(notice)

    @workflow.signal(name="drain")
    def drain(self, notice: DrainNotice) -> None:
        self.messages.drain(notice)

    @workflow.signal(name="hand_over")
    def hand_over_signal(self, request: HandOverRequest) -> None:
        self.messages.hand_over(request)

    @workflow.update
    async def retry(self, request: RetryRequest) -> RetryAccepted:
        return self.messages.retry(request)

    @retry.validator
    def validate_retry(self, request: RetryRequest) -> None:
        self.messages.check_retry()

    @workflow.update
    async def release(self, request: ReleaseRequest) -> AllocationStatus:
        return self.messages.release()

    @release.validator
    def validate_release(self, request: ReleaseRequest) -> None:
        self.messages.check_release()

    @workflow.update
    async def extend(self, request: ExtendRequest) -> AllocationStatus:
        return self.messages.extend(request)

    @extend.validator
    def validate_extend(self, request: ExtendRequest) -> None:
        self.messages.check_extend(request)


__all__ = ["FINAL_STATES", "AllocationWorkflow"]
