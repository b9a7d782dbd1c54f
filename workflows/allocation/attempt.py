"""Step 3 on one candidate node: plan_bundles@node (a lease) -> record_claims* -> create_vm@node -> wait_ready@node
(no `wait_ready` where the create's own first look found the VM ready: a host whose VMs are ready the moment they
exist).

The attempt races an operator's `retry`; whatever it leaves undone (the lease, the claims, a VM that may exist) is
compensated newest first by its saga, shielded from cancellation. A failure on the node fails the attempt and the
placement moves to the next candidate (placement.py); a `final` one (quota at claim time, a state's deadline)
fails the allocation once the attempt is undone. The attempt that succeeds makes the allocation `active` and starts
its lease, which the hold (hold.py) keeps until its end.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import ClaimInput, LeaseRef, PlanInput, Readiness, ReadinessInput, VmSpec
    from contracts.failures import CLAIM_CONFLICT, QUOTA_EXCEEDED
    from contracts.placement import Candidate
    from workflows import search_attributes as sa
    from workflows.allocation.calls import Calls
    from workflows.allocation.failures import AttemptFailed, node_failure
    from workflows.allocation.messages import Attempt
    from workflows.allocation.revisions import LEASE_UNDONE_BEFORE_PLAN
    from workflows.allocation.state import RunState
    from workflows.saga import Saga

CREATE_VM_TIMEOUT = timedelta(minutes=5)
CREATE_VM_ATTEMPTS = 3
CONSOLE_REASON_LINES = 4  # of a failed boot's console, in the attempt's reason
CONSOLE_LINE_CHARS = 160


class NodeAttempt:
    def __init__(self, state: RunState, calls: Calls) -> None:
        self.state = state
        self.calls = calls
        self.mirror = calls.mirror
        self.clock = calls.clock

    async def try_candidate(self, candidate: Candidate) -> bool:
        """Run one attempt, racing it against an operator's `retry`; compensate whatever it leaves undone."""
        state, status = self.state, self.state.status
        attempt = Attempt(number=len(status.attempts) + 1, node=candidate.node, pool=candidate.pool)
        state.deadlines = state.input.timing.deadlines.with_overrides(state.pool_deadlines.get(candidate.pool, {}))
        status.attempts.append(attempt)
        status.node, status.pool = candidate.node, candidate.pool
        saga = Saga()
        state.inbox.retry = False
        running = asyncio.ensure_future(self.attempt(attempt, saga))
        retry = asyncio.ensure_future(workflow.wait_condition(lambda: state.inbox.retry))
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
            now_in = status.state if failure.final else "placing"
            self.calls.set_state(now_in, "attempt_failed", node=candidate.node, attempt=attempt, reason=attempt.reason)
            await saga.compensate()
            status.node = status.pool = None
            status.bundles = []
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
        input, node = self.state.input, attempt.node
        request, allocation_id = input.request, input.allocation_id
        self.calls.set_state("planning", "plan_bundles", node=node, attempt=attempt)
        asked = PlanInput(
            allocation_id=allocation_id,
            attempt=attempt.number,
            gpu_count=request.gpu_count,
            shape=request.shape,
            numa_policy=request.numa_policy,
            gpus=sorted(request.gpus),
        )
        lease_undone_first = input.revision >= LEASE_UNDONE_BEFORE_PLAN
        if lease_undone_first:
            # Registered before the plan, as destroy_vm is before the create: a plan whose answer is lost (its
            # deadline passed while the agent still planned) may have leased all the same.
            saga.add("release_lease", lambda: self.release_lease(node))
        try:
            plan = await self.calls.on_node(node, steps.plan_bundles, asked, deadline=self.clock.time_left(node))
        except ActivityError as error:
            raise self.clock.failure_on(error, node) from error
        if plan.refusal_code is not None:
            saga.discard("release_lease")  # a refusal leases nothing
            raise AttemptFailed(plan.refusal_code, plan.refusal_message or "the node refused the plan")
        if not lease_undone_first:
            saga.add("release_lease", lambda: self.release_lease(node))

        self.calls.set_state("claiming", "record_claims", node=node, attempt=attempt)
        claim = ClaimInput(
            allocation_id=allocation_id,
            attempt=attempt.number,
            node=node,
            tenant=input.tenant,
            gpu_count=request.gpu_count,
            bundles=plan.bundles,
            within_nominal=request.within_nominal,
        )
        try:
            await self.calls.on_control(steps.record_claims, claim, deadline=self.clock.time_left(node))
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.type == QUOTA_EXCEEDED:
                # The attempt failed, with the reason, then the allocation.
                raise AttemptFailed("quota_exceeded", cause.message, final=QUOTA_EXCEEDED) from error
            if isinstance(cause, ApplicationError) and cause.type == CLAIM_CONFLICT:
                raise AttemptFailed("claim_conflict", cause.message) from error
            raise
        saga.add("release_claims", lambda: self.calls.release_claims(attempt.number))
        self.state.status.bundles = plan.bundles

        self.calls.set_state("provisioning", "create_vm", node=node, attempt=attempt)
        # Registered before the create: a create cut short by a failure or a cancel may still have made a VM.
        saga.add("destroy_vm", lambda: self.calls.destroy_vm(node, attempt.number, plan.slot_indexes))
        spec = VmSpec(
            allocation_id=allocation_id,
            node=node,
            bundles=plan.bundles,
            image=input.image,
            ssh_public_keys=input.ssh_public_keys,
            user_data=input.user_data,
            first_look=self.readiness_probe(node) if plan.ready_when_created else None,
        )
        create = self.calls.on_node(
            node,
            steps.create_vm,
            spec,
            start_to_close=CREATE_VM_TIMEOUT,
            attempts=CREATE_VM_ATTEMPTS,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            # The timeline's line says the create looks at readiness too, where it does.
            summary=f"create_vm + wait_ready on {node}" if plan.ready_when_created else None,
        )
        try:
            created = await self.clock.race(
                node, create, self.clock.longest_node_call(CREATE_VM_TIMEOUT, CREATE_VM_ATTEMPTS)
            )
        except ActivityError as error:
            raise node_failure(error, node) from error

        self.calls.set_state("waiting_ready", "wait_ready", node=node, attempt=attempt)
        # A host whose VMs are ready the moment they exist (its plan's answer said so) took the first readiness look in
        # the create: a VM ready then needs no `wait_ready` step. Both branches follow answers recorded in the history,
        # so runs made before the look existed replay as they ran.
        if created.readiness is None or not created.readiness.ready:
            await self.wait_until_ready(node)
        attempt.outcome = "succeeded"
        self.begin_lease(attempt.pool)
        ends_at = self.state.status.ends_at
        ends = self.mirror.end_values(ends_at, expiring=False)  # the end rides with `active`: one upsert, not two
        self.calls.set_state("active", "ready", node=node, attempt=attempt, ends_at=ends_at, also=ends)

    async def wait_until_ready(self, node: str) -> None:
        """Probe the readiness gates a window at a time until every gate passes; a gate that failed for good, or no
        readiness within the node's timeout, fails the attempt; past the state's deadline, the allocation."""
        timing = self.state.input.timing
        probe = self.readiness_probe(node)
        give_up = workflow.now() + timedelta(seconds=timing.readiness_timeout_seconds)
        while True:
            try:
                report = await self.calls.on_node(
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
                failure = f"{report.failed_gate}: {report.failure or 'failed'}"
                raise AttemptFailed("readiness_failed", failure + _console_lines(report))
            remaining = (give_up - workflow.now()).total_seconds()
            if remaining <= 0:
                waiting = f"waiting for {', '.join(report.pending())}"
                raise AttemptFailed(
                    "readiness_timeout",
                    f"not ready after {timing.readiness_timeout_seconds:g}s: {waiting}"
                    + (f" ({report.detail})" if report.detail else "")
                    + _console_lines(report),
                )
            left = self.clock.time_left(node)  # past the state's deadline: the allocation fails
            pause = min(timing.readiness_poll_seconds, remaining)
            await workflow.sleep(pause if left is None else min(pause, left.total_seconds()))

    def readiness_probe(self, node: str) -> ReadinessInput:
        input = self.state.input
        return ReadinessInput(
            allocation_id=input.allocation_id,
            node=node,
            gpu_count=input.request.gpu_count,
            window_seconds=input.timing.readiness_window_seconds,
        )

    def begin_lease(self, pool: str) -> None:
        """Active now: the end it asked for (`duration_seconds` from now, or `ends_at`), else its pool's `maxLease`
        from now, else none. The pool's maximum was checked when the pool was chosen (`scheduler.placement.pools`)."""
        state = self.state
        if state.active_since is not None:
            return  # placed again off a failed GPU: it keeps the lease it had
        now = workflow.now()
        state.active_since, state.max_lease = now, state.pool_max_leases.get(pool)
        lease = state.input.lease
        if lease is not None and lease.ends_at is not None:
            state.status.ends_at = lease.ends_at
        elif lease is not None and lease.duration_seconds is not None:
            state.status.ends_at = now + timedelta(seconds=lease.duration_seconds)
        elif state.max_lease is not None:
            state.status.ends_at = now + timedelta(seconds=state.max_lease)

    async def release_lease(self, node: str) -> None:
        try:
            lease = LeaseRef(allocation_id=self.state.input.allocation_id, node=node)
            await self.calls.on_node(node, steps.release_lease, lease)
        except ActivityError:
            pass  # an unreachable agent cannot free its lease; the lease expires and the agent reaps it


def _console_lines(report: Readiness) -> str:
    """A failed boot's last console lines, for the attempt's reason (`alloc get`, explain): the few that say most."""
    lines = [line[:CONSOLE_LINE_CHARS] for line in report.console[-CONSOLE_REASON_LINES:]]
    return f"; console: {' | '.join(lines)}" if lines else ""
