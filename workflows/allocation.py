"""The allocation workflow: seed 004's placement flow, made durable (DESIGN.md section 2).

    1. select_region       tenant policy, quota, region status, product and price
    2. find_candidates     a pool and ranked candidate nodes from a fresh snapshot
                           (1 and 2 are one local activity, `choose_placement`, recording both steps)
    3. for each candidate  plan_bundles (node lease) -> record_claims -> create_vm -> wait_ready;
                           a failure compensates what the attempt did, in reverse, and moves to the next node
    4. active              hold the capacity until `release` or cancellation, then tear down
    5. no candidate left   fail with a non-retryable SkuUnavailable naming every attempt's node and reason

Every state change is mirrored to PostgreSQL (the allocation's row and its events) and to the Temporal UI (search
attributes and the current-details story). The PostgreSQL side travels as an audit trail with the next control
activity, and is written on its own only before a wait that no control step follows (see `AuditTrail`).
Each of those is a Temporal action a production namespace pays for, so the control steps run as local activities
on the worker that runs the workflow, and search attributes move only for the states the UI filters on
(`UI_STATES`); the fine-grained steps stay in the current details and the audit trail (docs/benchmarks.md,
"Performance (issue 14)": 10 actions to `active`, 3 for a refused request).
Compensations run even when the workflow is being cancelled, and a node that cannot be reached for teardown gets
its slots quarantined rather than blocking the allocation forever.
"""

from __future__ import annotations

import asyncio
import zlib
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)
from temporalio.workflow import ActivityCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contracts.allocation import (
        AllocationRecord,
        AuditTrail,
        CandidateList,
        ClaimInput,
        FindCandidatesInput,
        LeaseRef,
        PlacementChoice,
        PlanInput,
        PlanOutcome,
        QuarantineInput,
        Readiness,
        ReadinessInput,
        RegionChoice,
        ReleaseClaimsInput,
        StateChange,
        TeardownInput,
        TeardownResult,
        VmInfo,
        VmSpec,
    )
    from fleet.deadlines import format_duration
    from scheduler.nodes import Candidate
    from workflows import search_attributes as sa
    from workflows.allocation_messages import (
        FINAL_STATES,
        PLACING_STATES,
        AllocationInput,
        AllocationStatus,
        Attempt,
        ReleaseRequest,
        RetryAccepted,
        RetryRequest,
    )
    from workflows.cancellation import wait_unless_cancelled
    from workflows.recovery import SlotRecoveryInput, SlotRecoveryWorkflow
    from workflows.saga import Saga, shielded

# Runs that began before the audit trail wrote each step with a local activity of its own; they replay that way.
AUDIT_TRAIL_PATCH = "audit-trail-rides-with-control-steps"
# Runs that began before per-state deadlines wait as long as their steps do; they replay that way.
DEADLINES_PATCH = "state-deadlines"
# Runs that began before a quota refusal at claim time ended its attempt as failed replay it as cancelled.
QUOTA_ATTEMPT_PATCH = "quota-refusal-fails-the-attempt"
# Runs that began before control steps were local activities (region and candidates in one step, search attributes
# for the UI's states only) replay the commands they made. This one patch implies every patch above: a run that has
# it calls none of them, since each patch costs a marker and a search-attribute upsert.
LEAN_PATCH = "lean-control-steps"
# The states worth a search-attribute upsert (lean runs): long enough for the UI to filter on. `waiting_ready` only
# once a boot turns out not to be immediate (see `attempt`); planning and claiming last milliseconds.
UI_STATES = frozenset({"placing", "provisioning", "waiting_ready", "active", "releasing", *FINAL_STATES})

SKU_UNAVAILABLE = "SkuUnavailable"
PLACEMENT_REFUSED = "PlacementRefused"
QUOTA_EXCEEDED = "QuotaExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"

NODE_RETRY_INTERVAL = timedelta(seconds=5)  # the longest backoff between tries of a node call
# Every node call's heartbeat timeout: the agent heartbeats while any step runs (agent/liveness.py), so an
# agent killed or cut off mid-step is noticed within this and the step retried, not after its start-to-close.
NODE_HEARTBEAT = timedelta(seconds=10)
CREATE_VM_TIMEOUT = timedelta(minutes=5)
CREATE_VM_ATTEMPTS = 3

CONTROL_CALL = {
    "start_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(maximum_interval=timedelta(seconds=10)),
}


class AttemptFailed(Exception):
    """One candidate did not work out; the reason code is topology-specific where the node gave one. `final` (an
    error type) ends the whole allocation once the attempt is compensated, instead of moving to the next node."""

    def __init__(self, code: str, message: str, final: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.final = final

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.message}"

    def ending(self) -> ApplicationError:
        """The allocation's own failure, for a final one."""
        return ApplicationError(self.reason, type=self.final or SKU_UNAVAILABLE, non_retryable=True)


def _past_overall_timeout(error: ActivityError) -> bool:
    """The step ran out of its state's deadline (given to it as its schedule-to-close timeout)."""
    return isinstance(error.cause, TimeoutError) and error.cause.type == TimeoutType.SCHEDULE_TO_CLOSE


def _as_activity_error(activity: str, error: ApplicationError | TimeoutError) -> ActivityError:
    """A local activity's failure as an activity's: the SDK hands a local activity's non-retryable failure over
    bare, where an activity's comes wrapped; every caller here reads `ActivityError.cause`, whichever way it ran."""
    return ActivityError(
        f"local activity {activity} failed",
        scheduled_event_id=0,
        started_event_id=0,
        identity="",
        activity_type=activity,
        activity_id="",
        retry_state=None,
    )


def _node_failure(error: ActivityError, node: str) -> AttemptFailed:
    """Turn an activity failure on a node into an attempt's reason."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START:
        return AttemptFailed("agent_unreachable", f"the node agent of {node} did not pick the task up")
    if isinstance(cause, TimeoutError):
        return AttemptFailed("agent_timeout", f"the node agent of {node} stopped answering ({cause.type.name})")
    if isinstance(cause, ApplicationError):
        codes = {"VmCreateFailed": "vm_create_failed", "LeaseLost": "lease_lost", "ImageNotFound": "image_not_found",
                 "WipeFailed": "wipe_failed"}  # fmt: skip
        code = codes.get(cause.type or "", "node_error")
        return AttemptFailed(code, cause.message)
    return AttemptFailed("node_error", str(cause or error))


@workflow.defn(name="Allocation")
class AllocationWorkflow:
    @workflow.init
    def __init__(self, input: AllocationInput) -> None:
        self.input = input
        self.status = AllocationStatus(
            allocation_id=input.allocation_id,
            run_id=workflow.info().run_id,
            tenant=input.tenant,
            state="pending",
            step="accepted",
        )
        self.excluded: set[str] = set(input.request.exclude_nodes)
        self.tried: set[str] = set()  # never the same node twice in one run
        self.retry_requested = False
        self.release_requested = False
        self.trail = AuditTrail()  # steps not yet written to PostgreSQL
        # The search attribute values as they stand (set when the workflow was started), so only changes are upserted.
        self.published: dict[str, object] = {
            sa.STATE.name: "pending",
            sa.REGION.name: input.request.region or "",
            sa.NODE.name: "",
        }
        self.lean = False  # control steps as local activities, fewer upserts (runs from before replay without)
        self.trail_rides_along = False
        self.bounded = False  # per-state deadlines apply (runs from before them replay without)
        self.deadlines = input.timing.deadlines  # the chosen pool's, once a candidate is tried
        self.pool_deadlines: dict[str, dict[str, float]] = {}
        self.entered = workflow.now()  # when the current state's clock started
        self.final_recorded = False  # the placement step refused and recorded the final step itself

    # -- the flow ---------------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: AllocationInput) -> AllocationStatus:
        opening = AllocationRecord(
            allocation_id=input.allocation_id,
            tenant=input.tenant,
            request=input.request,
            workflow_id=workflow.info().workflow_id,
            request_body=input.request_body,
            idempotency_key=input.idempotency_key,
        )
        # Revision 1 on is lean by birth; older runs learn it from the patch marker their history has or lacks.
        self.lean = input.revision >= 1 or workflow.patched(LEAN_PATCH)
        self.trail_rides_along = self.lean or workflow.patched(AUDIT_TRAIL_PATCH)
        self.bounded = self.lean or workflow.patched(DEADLINES_PATCH)
        if self.trail_rides_along:
            self.trail = AuditTrail(opening=opening)
        else:
            await workflow.execute_local_activity("open_allocation", opening, **CONTROL_CALL)
        try:
            if self.lean:
                region, first = await self.choose_placement()  # 1, 2
            else:
                region, first = await self.select_region(), None  # 1
            await self.place(region, first)  # 2, 3 (and 5 when nothing works)
            await self.hold_until_released()  # 4
            await shielded(self.teardown("released", "release"))
        except BaseException as error:
            if is_cancelled_exception(error) and self.status.state not in FINAL_STATES:
                await shielded(self.teardown("cancelled", "cancel"))
            elif isinstance(error, ApplicationError):
                await self.set_state("failed", "failed", reason=error.message, recorded=self.final_recorded)
                await shielded(self.write_trail())
            raise
        return self.status

    async def select_region(self) -> str:
        await self.set_state("placing", "select_region")
        try:
            choice: RegionChoice = await self.on_control(
                "select_region", self.placement_input(""), RegionChoice, deadline=self.time_left()
            )
        except AttemptFailed as failure:
            raise failure.ending() from failure
        return self.accept_region(choice)

    async def choose_placement(self) -> tuple[str, list[Candidate]]:
        """Steps 1 and 2 as one control step on one snapshot; the trail still records each decision as its step.

        From revision 1 the UI learns `placing` with the decision (and its region) rather than before it, and the
        step records a refusal as the allocation's final step: a request refused here costs one local activity,
        one search-attribute upsert (`failed`) and one write."""
        revised = self.input.revision >= 1
        await self.set_state("placing", "select_region", publish=not revised)
        placement = self.placement_input("")
        if revised:
            placement = placement.model_copy(update={"final": self.state_change("failed", "failed")})
        try:
            choice: PlacementChoice = await self.on_control(
                "choose_placement", placement, PlacementChoice, deadline=self.time_left()
            )
        except AttemptFailed as failure:
            raise failure.ending() from failure
        self.final_recorded = choice.final_recorded  # a refusal: the step recorded its decisions and the end
        region = self.accept_region(choice.region)
        await self.set_state(
            "placing", "find_candidates", region=region, publish=not self.final_recorded, recorded=self.final_recorded
        )
        assert choice.candidates is not None  # the region level chose one, so the cluster level ran
        return region, self.accept_candidates(choice.candidates)

    def accept_region(self, choice: RegionChoice) -> str:
        """The region level's answer: the region, or the allocation's failure with the explanation."""
        if choice.region is None:
            kind = QUOTA_EXCEEDED if choice.refusal_code == "quota_exceeded" else PLACEMENT_REFUSED
            raise ApplicationError(
                choice.reason,
                choice.explanation.model_dump(mode="json") if choice.explanation else None,
                type=kind,
                non_retryable=True,
            )
        self.status.region = choice.region
        return choice.region

    async def find_candidates(self, region: str) -> list[Candidate]:
        self.entered = workflow.now()  # a new list: compensating the last attempt had its own bounds
        try:
            found: CandidateList = await self.on_control(
                "find_candidates", self.placement_input(region), CandidateList, deadline=self.time_left()
            )
        except AttemptFailed as failure:
            raise failure.ending() from failure
        return self.accept_candidates(found)

    def accept_candidates(self, found: CandidateList) -> list[Candidate]:
        """The cluster level's answer: the candidates, or (before any attempt) the allocation's failure."""
        self.pool_deadlines.update(found.deadlines)
        if found.refusal_code is not None and not self.status.attempts:
            raise ApplicationError(
                found.reason,
                found.explanation.model_dump(mode="json") if found.explanation else None,
                type=PLACEMENT_REFUSED,
                non_retryable=True,
            )
        return found.candidates

    async def place(self, region: str, first: list[Candidate] | None) -> None:
        """Try the ranked candidates in order (`first`: the list already found with the region); when the list runs
        out, re-plan once on a fresh snapshot."""
        for plan_round in range(2):
            if plan_round == 0 and first is not None:
                candidates = first
            else:
                await self.set_state("placing", "find_candidates", region=region)
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
        self.deadlines = self.input.timing.deadlines.with_overrides(self.pool_deadlines.get(candidate.pool, {}))
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
            await self.set_state(state, "attempt_failed", node=candidate.node, attempt=attempt, reason=attempt.reason)
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
        node, timing = attempt.node, self.input.timing
        await self.set_state("planning", "plan_bundles", node=node, attempt=attempt)
        try:
            plan: PlanOutcome = await self.on_node(
                node, "plan_bundles", PlanInput(allocation_id=self.input.allocation_id, attempt=attempt.number,
                gpu_count=self.input.request.gpu_count, shape=self.input.request.shape,
                numa_policy=self.input.request.numa_policy, gpus=sorted(self.input.request.gpus)), PlanOutcome,
                deadline=self.time_left(node),
            )  # fmt: skip
        except ActivityError as error:
            raise self.failure_on(error, node) from error
        if plan.refusal_code is not None:
            raise AttemptFailed(plan.refusal_code, plan.refusal_message or "the node refused the plan")
        saga.add("release_lease", lambda: self.release_lease(node))

        await self.set_state("claiming", "record_claims", node=node, attempt=attempt)
        try:
            await self.on_control(
                "record_claims",
                ClaimInput(allocation_id=self.input.allocation_id, attempt=attempt.number, node=node,
                           tenant=self.input.tenant, gpu_count=self.input.request.gpu_count, bundles=plan.bundles),
                list[int], deadline=self.time_left(node),
            )  # fmt: skip
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.type == "QuotaExceeded":
                # The attempt failed, with the reason, then the allocation.
                if self.lean or workflow.patched(QUOTA_ATTEMPT_PATCH):
                    raise AttemptFailed("quota_exceeded", cause.message, final=QUOTA_EXCEEDED) from error
                raise ApplicationError(cause.message, type=QUOTA_EXCEEDED, non_retryable=True) from error
            if isinstance(cause, ApplicationError) and cause.type == "ClaimConflict":
                raise AttemptFailed("claim_conflict", cause.message) from error
            raise
        saga.add("release_claims", lambda: self.release_claims(attempt.number))
        self.status.bundles = plan.bundles

        await self.set_state("provisioning", "create_vm", node=node, attempt=attempt)
        # Registered before the create: a create cut short by a failure or a cancel may still have made a VM.
        saga.add("destroy_vm", lambda: self.destroy_vm(node, attempt.number, plan.slot_indexes))
        spec = VmSpec(allocation_id=self.input.allocation_id, node=node, bundles=plan.bundles,
                      image=self.input.image, ssh_public_keys=self.input.ssh_public_keys)  # fmt: skip
        try:
            await self.within_deadline(node, self.on_node(
                node, "create_vm", spec, VmInfo, start_to_close=CREATE_VM_TIMEOUT, attempts=CREATE_VM_ATTEMPTS,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED),
                longest=self.longest_node_call(CREATE_VM_TIMEOUT, CREATE_VM_ATTEMPTS))  # fmt: skip
        except ActivityError as error:
            raise _node_failure(error, node) from error

        await self.set_state("waiting_ready", "wait_ready", node=node, attempt=attempt)
        if not self.lean:
            await self.write_trail()  # a boot can take minutes: the audit trail shows it is under way
        deadline = workflow.now() + timedelta(seconds=timing.readiness_timeout_seconds)
        while True:
            try:
                report: Readiness = await self.on_node(
                    node, "wait_ready",
                    ReadinessInput(allocation_id=self.input.allocation_id, node=node,
                                   gpu_count=self.input.request.gpu_count,
                                   window_seconds=timing.readiness_window_seconds),
                    Readiness, start_to_close=timedelta(seconds=timing.readiness_window_seconds + 30),
                    deadline=self.time_left(node),
                )  # fmt: skip
            except ActivityError as error:
                raise self.failure_on(error, node) from error
            if report.ready:
                break
            if self.lean and self.published.get(sa.STATE.name) != "waiting_ready":
                # Not ready at the first look: this boot takes a while, so the UI and the audit trail show the wait
                # (a boot that is ready at once never pays for either).
                self.publish(self.search_values("waiting_ready"))
                await self.write_trail()
            # A gate that failed for good: no point waiting out the timeout (patched: a run that slept here before
            # this change replays as it ran).
            if report.failed_gate is not None and (self.lean or workflow.patched("readiness-failed-gate")):
                raise AttemptFailed("readiness_failed", f"{report.failed_gate}: {report.failure or 'failed'}")
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                raise AttemptFailed(
                    "readiness_timeout",
                    f"not ready after {timing.readiness_timeout_seconds:g}s: waiting for {', '.join(report.pending())}",
                )
            left = self.time_left(node)  # past the state's deadline: the allocation fails
            pause = min(timing.readiness_poll_seconds, remaining)
            await workflow.sleep(pause if left is None else min(pause, left.total_seconds()))
        attempt.outcome = "succeeded"
        await self.set_state("active", "ready", node=node, attempt=attempt)

    async def hold_until_released(self) -> None:
        await self.write_trail()
        await wait_unless_cancelled(lambda: self.release_requested)

    async def teardown(self, final_state: str, step: str) -> None:
        """Give everything back: destroy the VM and wipe its slots, release the claims. Runs to completion even
        when the workflow is being cancelled."""
        if self.status.state == "active":
            await self.set_state("releasing", step)
            attempt = self.status.attempts[-1]
            await self.destroy_vm(
                attempt.node, attempt.number, [b.slot_index for b in self.status.bundles], deadline=self.time_left()
            )
            await self.release_claims(None)
        self.status.bundles = []
        await self.set_state(final_state, final_state)
        await self.write_trail()

    # -- control and node calls, compensations ------------------------------------------------------------------------

    async def on_control(
        self, activity: str, argument: BaseModel, result_type: type, *, deadline: timedelta | None = None
    ) -> Any:
        """Call a control activity, handing it the unwritten audit trail to write before its own work. If the call
        fails the trail goes back in line for the next write (writing a step twice changes nothing). `deadline`:
        what is left of the state's deadline; past it, with every retry, the state's deadline has passed."""
        trail = self.take_trail()
        try:
            if self.lean:  # on this worker: no task-queue round trip, no activity task on the server
                try:
                    return await workflow.execute_local_activity(
                        activity,
                        argument.model_copy(update={"trail": trail}),
                        result_type=result_type,
                        schedule_to_close_timeout=deadline,
                        **CONTROL_CALL,
                    )
                except (ApplicationError, TimeoutError) as bare:
                    raise _as_activity_error(activity, bare) from bare
            return await workflow.execute_activity(
                activity,
                argument.model_copy(update={"trail": trail}),
                result_type=result_type,
                task_queue=self.input.queues.control,
                schedule_to_close_timeout=deadline,
                **CONTROL_CALL,
            )
        except BaseException as error:
            self.trail = AuditTrail(
                opening=trail.opening or self.trail.opening, changes=[*trail.changes, *self.trail.changes]
            )
            if deadline is not None and isinstance(error, ActivityError) and _past_overall_timeout(error):
                raise self.deadline_passed(self.status.node) from error
            raise

    async def on_node(
        self,
        node: str,
        activity: str,
        argument: object,
        result_type: type,
        *,
        start_to_close: timedelta = timedelta(seconds=30),
        heartbeat: timedelta = NODE_HEARTBEAT,
        attempts: int = 3,
        cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
        deadline: timedelta | None = None,
    ) -> Any:  # the result type is the caller's
        """Call an activity on a node agent's own task queue. An agent that does not pick the task up within the
        pickup timeout is unreachable (schedule-to-start timeouts are not retried); one that stops heartbeating is
        gone, and the call is retried (on the agent when it is back). `deadline` bounds the call with every retry (a
        schedule-to-close timeout: no timer of the workflow's own)."""
        return await workflow.execute_activity(
            activity,
            argument,
            result_type=result_type,
            task_queue=self.input.queues.node(node),
            schedule_to_start_timeout=timedelta(seconds=self.input.timing.agent_pickup_seconds),
            schedule_to_close_timeout=deadline,
            start_to_close_timeout=start_to_close,
            heartbeat_timeout=heartbeat,
            retry_policy=RetryPolicy(maximum_attempts=attempts, maximum_interval=NODE_RETRY_INTERVAL),
            cancellation_type=cancellation_type,
            summary=f"{activity} on {node}",
        )

    async def release_lease(self, node: str) -> None:
        try:
            await self.on_node(node, "release_lease", LeaseRef(allocation_id=self.input.allocation_id, node=node), bool)
        except ActivityError:
            pass  # an unreachable agent cannot free its lease; the lease expires and the agent reaps it

    async def release_claims(self, attempt: int | None) -> None:
        await self.on_control(
            "release_claims", ReleaseClaimsInput(allocation_id=self.input.allocation_id, attempt=attempt), int
        )

    async def destroy_vm(
        self, node: str, attempt: int, slot_indexes: list[int], *, deadline: timedelta | None = None
    ) -> None:
        """Destroy and wipe on the node; if the node cannot be reached, or not within `deadline` (a release's), quarantine
        its slots and leave a recovery workflow waiting for the agent to come back and confirm the wipe."""
        teardown = TeardownInput(allocation_id=self.input.allocation_id, node=node, slot_indexes=slot_indexes)
        try:
            await self.on_node(node, "destroy_vm", teardown, TeardownResult, attempts=self.input.timing.teardown_attempts,
                               start_to_close=timedelta(minutes=2), deadline=deadline)  # fmt: skip
            return
        except ActivityError as error:
            failure = self.failure_on(error, node) if deadline is not None else _node_failure(error, node)
            reason = failure.reason
        await self.on_control(
            "quarantine_slots",
            QuarantineInput(allocation_id=self.input.allocation_id, attempt=attempt, node=node,
                            slot_indexes=slot_indexes, reason=f"wipe not confirmed: {reason}"),
            int,
        )  # fmt: skip
        await workflow.start_child_workflow(
            SlotRecoveryWorkflow.run,
            SlotRecoveryInput(teardown=teardown, queues=self.input.queues),
            id=f"recovery/{node}/{self.input.allocation_id}/{attempt}",
            task_queue=self.input.queues.control,
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"wipe {len(slot_indexes)} slot(s) of {node} when its agent returns",
        )

    # -- deadlines ---------------------------------------------------------------------------------------------------

    def time_left(self, node: str | None = None) -> timedelta | None:
        """What is left of the current state's deadline; None where none applies (a run from before deadlines, a
        state without one). Already past it: the deadline's failure."""
        limit = self.deadlines.of(self.status.state) if self.bounded else None
        if limit is None:
            return None
        left = self.entered + timedelta(seconds=limit) - workflow.now()
        if left <= timedelta(0):
            raise self.deadline_passed(node)
        return left

    def longest_node_call(self, start_to_close: timedelta, attempts: int) -> timedelta:
        """The longest a node call can take with every retry (`on_node`: each try waits for its pickup and runs for
        at most `start_to_close`; retries back off by at most NODE_RETRY_INTERVAL)."""
        pickup = timedelta(seconds=self.input.timing.agent_pickup_seconds)
        return attempts * (pickup + start_to_close) + (attempts - 1) * NODE_RETRY_INTERVAL

    def deadline_passed(self, node: str | None) -> AttemptFailed:
        state = "placing" if self.status.state == "pending" else self.status.state
        limit = self.deadlines.of(state) or 0.0
        where = f" on node {node}" if node else ""
        return AttemptFailed(
            "deadline_exceeded", f"{state} took longer than {format_duration(limit)}{where}", final=DEADLINE_EXCEEDED
        )

    def failure_on(self, error: ActivityError, node: str) -> AttemptFailed:
        """A node call's failure: the state's deadline when that is what ended it, else the node's own reason."""
        if self.bounded and _past_overall_timeout(error):
            return self.deadline_passed(node)
        return _node_failure(error, node)

    async def within_deadline(self, node: str, call: Any, longest: timedelta | None = None) -> Any:
        """Race a step that may create something (a VM) against the state's deadline. Past it the step is cancelled
        and waited for (`WAIT_CANCELLATION_COMPLETED`), so the compensation never races a create still running.
        `longest`: the most the step can take with all its retries; where the deadline is further away than that
        (lean runs), the race is already decided and its timer, an action of its own, is not started."""
        left = self.time_left(node)
        if left is None or (self.lean and longest is not None and longest < left):
            return await call
        running = asyncio.ensure_future(call)
        await workflow.wait([running], timeout=left.total_seconds())
        if running.done():
            return running.result()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        raise self.deadline_passed(node)

    # -- state, UI and audit ----------------------------------------------------------------------------------------

    def placement_input(self, region: str) -> FindCandidatesInput:
        # A per-allocation seed rotates equally ranked nodes, so a burst of identical requests fans out.
        seed = (
            self.input.request.seed
            if self.input.request.seed is not None
            else zlib.crc32(self.input.allocation_id.encode())
        )
        request = self.input.request.model_copy(
            update={"exclude_nodes": frozenset(self.excluded | self.tried), "seed": seed}
        )
        return FindCandidatesInput(allocation_id=self.input.allocation_id, request=request, region=region)

    async def set_state(
        self,
        state: str,
        step: str,
        *,
        node: str | None = None,
        attempt: Attempt | None = None,
        region: str | None = None,
        reason: str | None = None,
        publish: bool = True,
        recorded: bool = False,
    ) -> None:
        """Move to a state: the status, the UI (search attributes for the states it filters on, unless `publish` is
        off; the current details always) and the audit trail (unless a control step `recorded` the step already)."""
        if state != self.status.state:
            self.entered = workflow.now()
        self.status.state, self.status.step = state, step
        if state == "failed":
            self.status.failure_reason = reason
        if publish and (not self.lean or (state in UI_STATES and state != "waiting_ready")):
            # runs from before the trail replay the upserts they made (`always`)
            self.publish(self.search_values(state, region, node), always=not self.trail_rides_along)
        workflow.set_current_details(self.story())
        if recorded:
            return
        change = self.state_change(state, step, node=node, attempt=attempt, region=region, reason=reason)
        if self.trail_rides_along:
            self.trail = AuditTrail(opening=self.trail.opening, changes=[*self.trail.changes, change])
        else:
            await workflow.execute_local_activity("record_state", change, **CONTROL_CALL)

    def state_change(
        self,
        state: str,
        step: str,
        *,
        node: str | None = None,
        attempt: Attempt | None = None,
        region: str | None = None,
        reason: str | None = None,
    ) -> StateChange:
        """The step as the audit trail records it."""
        return StateChange(
            allocation_id=self.input.allocation_id,
            run_id=workflow.info().run_id,
            state=state,
            step=step,
            attempt=attempt.number if attempt else None,
            node=node,
            region=region or self.status.region,
            pool=attempt.pool if attempt else None,
            reason=reason,
            at=workflow.now(),
        )

    def search_values(self, state: str, region: str | None = None, node: str | None = None) -> dict[str, str]:
        return {
            sa.STATE.name: state,
            sa.REGION.name: region or self.status.region or "",
            sa.NODE.name: node or self.status.node or "",
        }

    def publish(self, values: dict[str, str], *, always: bool = False) -> None:
        """Upsert the search attributes that changed, once per change of state: each upsert is a visibility write on
        the server, so a step that keeps the state (finding candidates after choosing the region) waits for the next."""
        if not always and self.published.get(sa.STATE.name) == values[sa.STATE.name]:
            return
        keys = {sa.STATE.name: sa.STATE, sa.REGION.name: sa.REGION, sa.NODE.name: sa.NODE}
        changed = [
            keys[name].value_set(value) for name, value in values.items() if always or self.published.get(name) != value
        ]
        if changed:
            workflow.upsert_search_attributes(changed)
            self.published.update(values)

    def take_trail(self) -> AuditTrail:
        """Hand the unwritten steps to the activity about to run, which writes them first."""
        trail, self.trail = self.trail, AuditTrail()
        return trail

    async def write_trail(self) -> None:
        """Write the unwritten steps now: the workflow is about to wait with no control step ahead."""
        if self.trail:
            await workflow.execute_local_activity("record_trail", self.take_trail(), **CONTROL_CALL)

    def story(self) -> str:
        """The markdown the Temporal UI shows as this allocation's current details."""
        s = self.status
        lines = [
            f"**{s.state}** ({s.step}) - {self.input.request.describe()} for tenant {s.tenant}",
            "",
            f"region: {s.region or '-'} | pool: {s.pool or '-'} | node: {s.node or '-'}",
        ]
        if s.attempts:
            lines += ["", "| attempt | node | outcome | reason |", "| --- | --- | --- | --- |"]
            lines += [f"| {a.number} | {a.node} | {a.outcome} | {a.reason or ''} |" for a in s.attempts]
        if s.failure_reason:
            lines += ["", f"failure: {s.failure_reason}"]
        return "\n".join(lines)

    # -- operator messages ------------------------------------------------------------------------------------------

    @workflow.query
    def status_query(self) -> AllocationStatus:
        return self.status

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
            raise ValueError(f"allocation is {self.status.state}; only an allocation being placed can be retried")

    @workflow.update
    async def release(self, request: ReleaseRequest) -> AllocationStatus:
        self.release_requested = True
        return self.status

    @release.validator
    def validate_release(self, request: ReleaseRequest) -> None:
        if self.status.state != "active":
            hint = " (cancel it instead)" if self.status.state in PLACING_STATES else ""
            raise ValueError(f"allocation is {self.status.state}; only an active allocation can be released{hint}")


def initial_search_attributes(input: AllocationInput) -> TypedSearchAttributes:
    return TypedSearchAttributes(
        [
            SearchAttributePair(sa.KIND, "allocation"),
            SearchAttributePair(sa.STATE, "pending"),
            SearchAttributePair(sa.TENANT, input.tenant),
            SearchAttributePair(sa.GPU_COUNT, input.request.gpu_count),
            SearchAttributePair(sa.REGION, input.request.region or ""),
            SearchAttributePair(sa.NODE, ""),
        ]
    )


__all__ = ["FINAL_STATES", "AllocationWorkflow", "initial_search_attributes"]
