"""The reconciler: find where PostgreSQL, Temporal and the hosts disagree, and (with `repair`) heal what is safe.

    1. audit_targets             the nodes whose agent is live
    2. host_state@node           each agent's own VMs and leases, all at once; an agent that does not pick the task
                                 up within the pickup timeout is `agent_unreachable` and nothing on it is judged
    3. audit_assess              PostgreSQL, then the open workflows, then the pure drift rules: findings recorded
    4. repair (if asked), for each finding the rules allow, one at a time:
         destroy_vm / release_lease       audit_confirm_idle first: never touch an allocation whose workflow is open
         teardown (stale claim)           audit_confirm_idle -> destroy_vm@node (destroy, wipe) -> release the claims
         free_slot / lift_quarantine      wipe_slots@node (refuses a slot in use) -> the slot becomes available
         close_allocation                 control only: an allocation whose workflow ended without finishing (say,
                                          terminated in the Temporal UI) gets a final row: failed, with the reason
       every repair, done or not, is recorded (audit_repairs; allocation_events for an allocation's own)
    5. audit_finish
    6. admit_queued              walk every region's queue: capacity a repair freed, a fleet change or a lost wake
                                 since the last pass (activities/control/admission.py)

A Temporal Schedule (`workflows.reconcile.client.ensure_schedule`, id `berth-reconciler`, overlap SKIP) runs it every minute;
`POST /v1/audit` and `berth audit` run one now. One run is short and starts fresh each time: no continue-as-new.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import AdmitInput, LeaseRef, TeardownInput
    from contracts.audit import (
        ApplyRepair,
        AssessInput,
        AuditReport,
        Finding,
        FinishAudit,
        HostState,
        IdleCheck,
        Repair,
        RepairAction,
        WipeRequest,
    )
    from contracts.task_queues import Queues
    from workflows import control_calls, node_calls

R = TypeVar("R")


class ReconcileInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    repair: bool = False
    trigger: str = "schedule"
    orphan_grace_seconds: float = Field(
        default=600.0, ge=0, description="An orphan VM is destroyed once found in two audits in a row or this old."
    )
    agent_pickup_seconds: float = Field(default=5.0, gt=0, description="An agent slower to pick up is unreachable.")
    queues: Queues = Field(default_factory=Queues)


@workflow.defn(name="Reconcile")
class ReconcileWorkflow:
    def __init__(self) -> None:
        self.input = ReconcileInput()

    @workflow.run
    async def run(self, input: ReconcileInput) -> AuditReport:
        self.input = input
        workflow.set_current_details("asking every live agent for its VMs and leases")
        targets = await self.control(steps.audit_targets)
        hosts = list(await asyncio.gather(*(self.host_state(node) for node in targets.nodes)))
        workflow.set_current_details(f"comparing {len(hosts)} host(s) with PostgreSQL and the open workflows")
        report = await self.control(
            steps.audit_assess,
            AssessInput(
                workflow_id=workflow.info().workflow_id,
                trigger=input.trigger,
                repair=input.repair,
                control_queue=input.queues.control,
                orphan_grace_seconds=input.orphan_grace_seconds,
                hosts=hosts,
            ),
        )
        assert report.run_id is not None
        repairs: list[Repair] = []
        if input.repair:
            for finding in report.findings:
                if finding.repairable:
                    workflow.set_current_details(f"repairing: {finding.message}")
                    repairs.append(await self.repair(report.run_id, finding))
        finished = await self.control(steps.audit_finish, FinishAudit(run_id=report.run_id))
        # Step 6 came after the reconciler's first release: the marker keeps a run in flight at the upgrade replaying.
        if workflow.patched("walk-queues"):
            workflow.set_current_details("walking the queues of requests waiting for capacity")
            await self.control(steps.admit_queued, AdmitInput())
        done = report.model_copy(update={"repairs": repairs, "finished_at": finished})
        workflow.set_current_details(self.story(done))
        return done

    async def host_state(self, node: str) -> HostState:
        try:
            return await self.on_node(node, steps.host_state)
        except ActivityError as error:
            cause = error.cause or error
            return HostState(node=node, reachable=False, error=str(getattr(cause, "message", None) or cause))

    async def repair(self, run_id: int, finding: Finding) -> Repair:
        """The node half, then the control half with the record; a node half that fails is recorded as failed."""
        node, allocation = finding.node or "", finding.allocation_id or ""
        error: str | None = None
        try:
            if finding.repair in (RepairAction.DESTROY_VM, RepairAction.RELEASE_LEASE, RepairAction.TEARDOWN):
                idle = IdleCheck(allocation_id=allocation, control_queue=self.input.queues.control)
                await self.control(steps.audit_confirm_idle, idle)
            if finding.repair in (RepairAction.DESTROY_VM, RepairAction.TEARDOWN):
                teardown = TeardownInput(allocation_id=allocation, node=node, slot_indexes=finding.slot_indexes)
                await self.on_node(node, steps.destroy_vm, teardown, start_to_close=timedelta(minutes=2))
            elif finding.repair is RepairAction.RELEASE_LEASE:
                await self.on_node(node, steps.release_lease, LeaseRef(allocation_id=allocation, node=node))
            elif finding.repair in (RepairAction.FREE_SLOT, RepairAction.LIFT_QUARANTINE):
                wipe = WipeRequest(node=node, slot_indexes=finding.slot_indexes)
                await self.on_node(node, steps.wipe_slots, wipe, start_to_close=timedelta(minutes=10))
            # close_allocation has no node half: audit_apply_repair re-checks the workflow and closes the row.
        except ActivityError as failure:
            cause = failure.cause or failure
            error = str(getattr(cause, "message", None) or cause)
        applied = ApplyRepair(run_id=run_id, finding=finding, control_queue=self.input.queues.control, node_error=error)
        return await self.control(steps.audit_apply_repair, applied)

    async def control(self, step: Callable[..., Awaitable[R]], *args: BaseModel) -> R:
        """Five tries at most: the next pass looks again (workflows/control_calls.py)."""
        return await control_calls.on_control(self.input.queues, step, *args, retry=control_calls.PASS_RETRY)

    async def on_node(self, node: str, step: Callable[..., R], *args: BaseModel, **options: Any) -> R:
        """Two tries; an agent that does not pick the task up in time is unreachable (workflows/node_calls.py)."""
        pickup = timedelta(seconds=self.input.agent_pickup_seconds)
        return await node_calls.on_node(
            self.input.queues, node, step, *args, pickup=pickup, heartbeat=None, attempts=2, **options
        )

    @staticmethod
    def story(report: AuditReport) -> str:
        kinds: dict[str, int] = {}
        for finding in report.findings:
            kinds[finding.kind.value] = kinds.get(finding.kind.value, 0) + 1
        found = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "no drift"
        done = sum(1 for repair in report.repairs if repair.outcome == "done")
        return f"checked {len(report.nodes_checked)} host(s): {found}; {done} repair(s) done"
