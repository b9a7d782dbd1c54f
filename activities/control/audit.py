"""The reconciler's control activities: gather what PostgreSQL and Temporal say, judge it (`drift.assess`), record
the findings, and carry out the control half of each repair with its record.

    audit_targets       the nodes with a live agent (the workflow asks each for its VMs and leases)
    audit_assess        PostgreSQL facts (one REPEATABLE READ snapshot), THEN the open workflows, then drift;
                        records the run and its findings
    audit_confirm_idle  just before a VM or lease is destroyed: is the allocation's workflow still closed?
    audit_apply_repair  release the claims / free the slot / lift the quarantine / close an abandoned allocation's
                        row, and record the repair
    audit_finish        the run is over (GET /v1/audit shows the latest finished run)

PostgreSQL is read before Temporal on purpose: a claim is written by a workflow that is already open, so a claim
seen in the snapshot whose workflow is not open afterwards is truly stale. Visibility can lag a start by a moment,
so every allocation that would be judged "not in flight" is confirmed by describing its workflow.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.control.drift import assess
from contracts.allocation import FINAL_STATES
from contracts.audit import (
    ApplyRepair,
    AssessInput,
    AuditReport,
    AuditTargets,
    Finding,
    FinishAudit,
    IdleCheck,
    Repair,
    RepairAction,
)
from store import audit as records
from store import requests, usage
from store.db import AsyncSession, async_sessionmaker
from store.usage import DEFAULT_RETENTION

ALLOCATION_PREFIX = "allocation/"
RECOVERY_PREFIX = "recovery/"
RESERVATION_PREFIX = "reservation/"
IN_FLIGHT = "InFlight"


def allocation_of(workflow_id: str) -> str | None:
    """`allocation/<id>` and `recovery/<node>/<id>/<attempt>` -> the allocation id; anything else -> None."""
    if workflow_id.startswith(ALLOCATION_PREFIX):
        return workflow_id.removeprefix(ALLOCATION_PREFIX) or None
    parts = workflow_id.split("/")
    if workflow_id.startswith(RECOVERY_PREFIX) and len(parts) >= 4:
        return "/".join(parts[2:-1]) or None
    return None


ROLLUP_STEP = timedelta(days=1)  # a run every minute catches up a year behind within a working day


class AuditActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        client: Client,
        usage_retention: timedelta = DEFAULT_RETENTION,
        request_retention: timedelta = DEFAULT_RETENTION,
    ) -> None:
        """`usage_retention`: how long the usage ledger keeps raw intervals before they are rolled up per hour;
        `request_retention`: how long the API's request log keeps its records."""
        self.sessions = sessions
        self.client = client
        self.usage_retention = usage_retention
        self.request_retention = request_retention

    @activity.defn(name="audit_targets")
    async def audit_targets(self) -> AuditTargets:
        async with self.sessions() as session:
            return AuditTargets(nodes=sorted(await records.live_agent_nodes(session)))

    @activity.defn(name="audit_assess")
    async def audit_assess(self, request: AssessInput) -> AuditReport:
        async with self.sessions() as session:
            facts, previous = await records.assessment_facts(session)
        in_flight, reservations_in_flight = await self._open_workflows(request.control_queue)
        mentioned = {c.allocation_id for c in facts.claims} | {a.allocation_id for a in facts.allocations}
        for host in request.hosts:
            mentioned |= {vm.allocation_id for vm in host.vms} | {lease.allocation_id for lease in host.leases}
        mentioned |= {(s.quarantine_reason or "").split(":", 1)[0].strip() for s in facts.slots if s.quarantine_reason}
        for allocation in sorted(mentioned - in_flight - {""}):
            if await self._running(allocation):
                in_flight.add(allocation)
        facts = facts.model_copy(
            update={"in_flight": sorted(in_flight), "reservations_in_flight": sorted(reservations_in_flight)}
        )
        now = datetime.now(UTC)
        findings = assess(facts, request.hosts, previous, now, request.orphan_grace_seconds)
        nodes = sorted(host.node for host in request.hosts)
        async with self.sessions.begin() as session:
            run = await records.open_run(session, request.workflow_id, request.trigger, request.repair, nodes)
            await records.record_findings(session, run.id, findings)
            run_id, started_at = run.id, run.started_at
        return AuditReport(
            run_id=run_id,
            workflow_id=request.workflow_id,
            trigger=request.trigger,
            repair=request.repair,
            started_at=started_at,
            nodes_checked=nodes,
            findings=findings,
        )

    async def _open_workflows(self, control_queue: str) -> tuple[set[str], set[str]]:
        """Allocations whose allocation or slot-recovery workflow, and reservations whose workflow, runs on this
        deployment's control queue."""
        query = f"ExecutionStatus = 'Running' AND TaskQueue = '{control_queue}'"
        allocations: set[str] = set()
        reservations: set[str] = set()
        async for execution in self.client.list_workflows(query):
            allocation = allocation_of(execution.id)
            if allocation is not None:
                allocations.add(allocation)
            elif execution.id.startswith(RESERVATION_PREFIX):
                reservations.add(execution.id.removeprefix(RESERVATION_PREFIX))
        return allocations, reservations

    async def _running(self, allocation_id: str) -> bool:
        return await self._status(allocation_id) == WorkflowExecutionStatus.RUNNING

    async def _status(self, allocation_id: str) -> WorkflowExecutionStatus | None:
        """The allocation workflow's status; None when Temporal has no such workflow (never started, or past
        retention)."""
        try:
            description = await self.client.get_workflow_handle(f"{ALLOCATION_PREFIX}{allocation_id}").describe()
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return description.status

    @activity.defn(name="audit_confirm_idle")
    async def audit_confirm_idle(self, check: IdleCheck) -> None:
        """Raise `InFlight` (non-retryable) when the allocation's workflow has started again since the assessment."""
        if await self._running(check.allocation_id):
            raise ApplicationError(
                f"allocation {check.allocation_id} has an open workflow again; nothing of it is touched",
                type=IN_FLIGHT,
                non_retryable=True,
            )

    @activity.defn(name="audit_apply_repair")
    async def audit_apply_repair(self, request: ApplyRepair) -> Repair:
        """The control half of a repair in one transaction with its record. Each statement re-checks the state it
        changes (a claim still active, a slot still reserved with no claim, still quarantined), so a repair that
        raced a workflow changes nothing and says so."""
        finding = request.finding
        assert finding.repair is not None
        if finding.allocation_id is not None and finding.repair is RepairAction.TEARDOWN:
            if await self._running(finding.allocation_id):
                request = request.model_copy(update={"node_error": "its allocation's workflow is open again"})
        async with self.sessions.begin() as session:
            if request.node_error is not None:
                outcome, message = "failed", f"not repaired: {request.node_error}"
            else:
                outcome, message = await self._apply(session, request)
            repair = Repair(
                kind=finding.kind,
                action=finding.repair,
                node=finding.node,
                allocation_id=finding.allocation_id,
                slot_indexes=finding.slot_indexes,
                outcome=outcome,
                message=message,
                at=datetime.now(UTC),
            )
            await records.record_repair(session, request.run_id, repair)
        return repair

    async def _apply(self, session: AsyncSession, request: ApplyRepair) -> tuple[str, str]:
        finding = request.finding
        node, indexes = finding.node, finding.slot_indexes
        if finding.repair is RepairAction.CLOSE_ALLOCATION:
            return await self._close(session, finding.allocation_id or "")
        if finding.repair is RepairAction.TELL_ALLOCATION:
            return await self._tell(session, finding)
        if finding.repair is RepairAction.REBUILD_USAGE:
            allocation = finding.allocation_id or ""
            rebuilt = await usage.repair(session, allocation)
            if not rebuilt:
                return "skipped", f"the usage ledger of {allocation} agrees with its claims now; nothing changed"
            return "done", f"rebuilt {rebuilt} interval(s) of {allocation}'s usage from its claims"
        if finding.repair is RepairAction.DESTROY_VM:
            return "done", f"destroyed the VM of {finding.allocation_id} on {node} and wiped slots {indexes}"
        if finding.repair is RepairAction.RELEASE_LEASE:
            return "done", f"released the lease of {finding.allocation_id} on {node}"
        if finding.repair is RepairAction.TEARDOWN:
            released = await records.release_stale_claims(session, finding.allocation_id, node)
            return "done", f"wiped slots {indexes} of {node}, released {released} stale claim(s) and freed the slots"
        wanted = "reserved" if finding.repair is RepairAction.FREE_SLOT else "quarantined"
        if not await records.make_available(session, node, indexes, wanted):
            return "skipped", f"slots {indexes} of {node} were no longer {wanted} without a claim; nothing changed"
        verb = "freed" if wanted == "reserved" else "lifted the quarantine of"
        return "done", f"the agent wiped slots {indexes} of {node}; {verb} them"

    async def _tell(self, session: AsyncSession, finding: Finding) -> tuple[str, str]:
        """Signal the allocation that a GPU of it failed (the `gpu_failed` signal its workflow takes once)."""
        node, index = finding.node or "", finding.slot_indexes[0]
        allocation, slot = finding.allocation_id or "", f"{node}/{index}"
        notice = await records.gpu_failure_notice(session, node, index)
        try:
            await self.client.get_workflow_handle(f"{ALLOCATION_PREFIX}{allocation}").signal("gpu_failed", notice)
        except RPCError as error:
            return "failed", f"allocation {allocation} was not told that slot {slot} failed: {error.message}"
        return "done", f"told allocation {allocation} that the GPU of slot {slot} failed"

    async def _close(self, session: AsyncSession, allocation_id: str) -> tuple[str, str]:
        """Make an abandoned allocation's row final. The row is locked and re-read, and the workflow described,
        here: a row that became final meanwhile, or a workflow started again (a retry), is left alone.

        A workflow that ended any way but completing never wrote its final state: the row becomes `failed`, its
        reason saying how the workflow ended and in which state (`workflow_terminated: ... while provisioning`). One
        that completed returned its final status, and the row takes that (its own last write was lost)."""
        row = await records.locked_allocation(session, allocation_id)
        if row is None or row.state in FINAL_STATES:
            return "skipped", f"allocation {allocation_id} is {row.state if row else 'gone'}; nothing changed"
        status = await self._status(allocation_id)
        if status == WorkflowExecutionStatus.RUNNING:
            return "skipped", f"the workflow of {allocation_id} is running again; its row is left to it"
        before = row.state
        state, reason = "failed", self._ended_reason(status, before)
        if status == WorkflowExecutionStatus.COMPLETED:
            result = await self.client.get_workflow_handle(f"{ALLOCATION_PREFIX}{allocation_id}").result()
            if isinstance(result, dict) and result.get("state") in FINAL_STATES:
                state, reason = result["state"], result.get("failure_reason")
        await records.close_allocation(session, row, state, reason)
        return "done", f"closed allocation {allocation_id}: {before} -> {state}" + (f" ({reason})" if reason else "")

    @staticmethod
    def _ended_reason(status: WorkflowExecutionStatus | None, before: str) -> str:
        """`workflow_<how>: ...`, the code first as every failure reason (api/metrics.py counts by it)."""
        code = "gone" if status is None else status.name.lower()
        how = "not found in Temporal" if status is None else code.replace("_", " ")
        return (
            f"workflow_{code}: the allocation's workflow ended ({how}) while {before}, without the compensation that "
            "gives capacity back; the reconciler releases what it held"
        )

    @activity.defn(name="audit_finish")
    async def audit_finish(self, request: FinishAudit) -> datetime | None:
        """The run is over; and the usage ledger's oldest day past its retention is rolled up (one day a run, in a
        transaction of its own: a crash leaves that day raw, and the next run rolls it up), and the request log's
        records past theirs are forgotten (a bite a run)."""
        async with self.sessions.begin() as session:
            finished = await records.finish_run(session, request.run_id)
        now = datetime.now(UTC)
        async with self.sessions.begin() as session:
            await usage.roll_up_step(session, now, self.usage_retention, ROLLUP_STEP)
        async with self.sessions.begin() as session:
            await requests.prune(session, now - self.request_retention)
        return finished

    def activities(self) -> list[object]:
        return [
            self.audit_targets,
            self.audit_assess,
            self.audit_confirm_idle,
            self.audit_apply_repair,
            self.audit_finish,
        ]
