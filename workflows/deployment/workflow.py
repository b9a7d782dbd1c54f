"""The ModelDeployment workflow: owns one deployment's spec and keeps its replicas where the fleet scheduler says
(docs/design.md section 3; Modelplane's retain -> scale down -> fill, as a pure function of observed state).

    loop, one reconcile at a time, woken by
      a spec update (`apply_spec`, validated first), an inventory change (`inventory_changed` signal),
      a replica's report (ready, failed, removed), or the periodic resync timer
    reconcile
      1. plan_deployment        observed state (PostgreSQL + cluster driver) -> schedule_deployment, in the activity
      2. remove dropped         cancel the replica's workflow (it tears itself down), then make sure: delete the
                                workload, release its ledger rows
      3. start new              a child workflow per new replica: replica/<deployment>/<cluster>/<index>
                                (replica/<namespace>/<deployment>/<cluster>/<index> outside `default`)
      4. status                 desired, scheduled, available, phase and explanation -> query, PostgreSQL row,
                                search attributes, current details
    delete (update or cancellation)
      remove every replica, delete the deployment's row, complete (a cancellation ends Cancelled)

The deployment's namespace comes with its input (`default` for histories from before namespaces, so their
commands replay unchanged) and keys every row, replica workflow id and workload it touches.

Continue-as-new when Temporal suggests it (after every handler has finished), carrying the spec and the replicas.
Replica workflows are started with parent close policy ABANDON, so they outlive each run of this one; they report
back by signal, by workflow id, which always reaches the current run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError, is_cancelled_exception
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    # The fleet's models check carried blocks with jsonschema, imported when first needed (fleet/openapi.py): that
    # can be while this workflow's input is decoded, so it must be a pass-through module here, or the sandbox
    # imports it afresh under its restrictions and the import fails (`platform.python_implementation`).
    import jsonschema  # noqa: F401

    from contracts import steps
    from contracts.deployment import (
        ClusterNote,
        DeploymentRef,
        DeploymentStatusRecord,
        EngineUsage,
        PlanDeploymentInput,
        PlannedDeployment,
        ReplicaRef,
        ReplicaSummary,
        WorkloadRef,
    )
    from contracts.fleet_plan import FleetPlan, ReplicaPlacement
    from fleet.replica import ready_status
    from workflows import control_calls
    from workflows import search_attributes as sa
    from workflows.cancellation import wait_unless_cancelled
    from workflows.deployment.messages import (
        DeleteRequest,
        DeploymentInput,
        DeploymentState,
        DeploymentStatus,
        InventoryChanged,
        ReplicaInput,
        ReplicaReport,
        ReplicaView,
        SpecUpdate,
        qualified_name,
    )
    from workflows.deployment.replica import ReplicaWorkflow, replica_workflow_id
    from workflows.deployment.spec import check_manifest
    from workflows.saga import shielded

R = TypeVar("R")

FAILURES_KEPT = 10


@workflow.defn(name="ModelDeployment")
class DeploymentWorkflow:
    @workflow.init
    def __init__(self, input: DeploymentInput) -> None:
        self.input = input
        self.name = input.name
        self.namespace = input.namespace
        self.manifest = input.manifest
        self.replicas: dict[str, ReplicaView] = {r.name: r for r in input.replicas}
        self.status = input.status or DeploymentStatus(name=input.name, namespace=input.namespace)
        self.dirty = input.reconcile_pending
        self.replan_after_conflict = False
        self.report_pending = False  # a replica reported since the status was last published
        self.moving = False  # the last plan moves replicas off draining capacity: a replica ready re-plans
        self.delete_requested = input.delete_requested
        self.reconciles_this_run = 0

    # -- the flow ---------------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: DeploymentInput) -> DeploymentStatus:
        try:
            while not self.delete_requested:
                await self.wait_for_work()
                if self.delete_requested:
                    break
                if self.dirty:
                    await self.reconcile()
                elif self.report_pending:
                    self.report_pending = False
                    await self.publish("steady")  # a replica became ready: mirror it
                if self.should_continue_as_new():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    workflow.continue_as_new(self.carried_over())
            await shielded(self.teardown())
        except BaseException as error:
            if is_cancelled_exception(error) and self.status.state != "deleted":
                await shielded(self.teardown())
            raise
        return self.status

    async def wait_for_work(self) -> None:
        """Until something asks for a reconcile: a spec update, an inventory change, a replica's report, or the
        resync timer (a timeout of the wait, caught: sdk-python#800)."""
        if self.replan_after_conflict:
            self.replan_after_conflict = False
            await workflow.sleep(timedelta(seconds=self.input.timing.conflict_backoff_seconds))
            self.dirty = True
        try:
            await wait_unless_cancelled(
                lambda: self.dirty or self.delete_requested or self.report_pending,
                at_most=timedelta(seconds=self.input.timing.resync_seconds),
            )
        except TimeoutError:
            self.dirty = True  # periodic resync

    async def reconcile(self) -> None:
        self.dirty = self.report_pending = False
        self.reconciles_this_run += 1
        self.status.reconciles += 1
        await self.publish("reconciling")
        planned: PlannedDeployment = await self.control(
            steps.plan_deployment,
            PlanDeploymentInput(
                deployment=self.manifest,
                # with each replica's readiness, for a scale-down that removes those still starting first
                own_replicas=[{**r.manifest, "status": ready_status(r.phase == "ready")} for r in self.live_replicas()],
            ),
            summary=f"plan {self.qualified_name}",
        )
        plan = planned.plan
        # Set before the awaits below: a replacement may report ready before its start is even confirmed here.
        self.moving = bool(plan.status.moving)
        for dropped in plan.dropped:
            replica = self.replicas.get(dropped.name)
            if replica is not None:
                why = f"{dropped.reason.value}: {dropped.message}"
                self.status.recent_removals = [*self.status.recent_removals, f"{dropped.name}: {why}"][-FAILURES_KEPT:]
                await self.remove_replica(replica, why)
        for placement, manifest in zip(plan.new, planned.new_replicas, strict=True):
            await self.start_replica(placement, manifest)
        for placement in plan.replicas:  # gateways may have changed since the replica was placed
            if placement.name in self.replicas:
                self.replicas[placement.name].gateway_address = placement.gateway_address
        self.take_status(plan)
        await self.publish("steady")

    async def start_replica(self, placement: ReplicaPlacement, manifest: dict[str, object]) -> None:
        child_id = replica_workflow_id(self.name, placement.cluster, placement.index, self.namespace)
        usage = [
            EngineUsage(
                engine=e.name,
                pool=e.pool or "",
                nodes=e.nodes,
                gpus=sum(len(m.gpus.nodes) * m.gpus.per_pod for m in e.members if m.gpus is not None),
            )
            for e in placement.engines
        ]
        replica = ReplicaView(
            name=placement.name,
            cluster=placement.cluster,
            index=placement.index,
            workflow_id=child_id,
            gateway_address=placement.gateway_address,
            engines=usage,
            manifest=manifest,
        )
        self.replicas[replica.name] = replica
        try:
            child = await workflow.start_child_workflow(
                ReplicaWorkflow.run,
                ReplicaInput(
                    namespace=self.namespace,
                    deployment=self.name,
                    deployment_workflow_id=workflow.info().workflow_id,
                    name=replica.name,
                    cluster=replica.cluster,
                    index=replica.index,
                    manifest=manifest,
                    usage=usage,
                    timing=self.input.timing,
                    queues=self.input.queues,
                ),
                id=child_id,
                task_queue=self.input.queues.control,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(sa.KIND, "replica"), SearchAttributePair(sa.STATE, "starting")]
                ),
                static_summary=f"replica {replica.index} of {self.qualified_name} on {replica.cluster}",
            )
            # Its outcome arrives as a replica_report signal; only mark the handle's result as seen.
            child.add_done_callback(lambda done: done.cancelled() or done.exception())
        except WorkflowAlreadyStartedError:
            # The previous replica under this id is still finishing its teardown: place it on a later pass.
            del self.replicas[replica.name]
            self.replan_after_conflict = True

    async def remove_replica(self, replica: ReplicaView, reason: str) -> None:
        """Cancel the replica's workflow and wait for its teardown; then make sure, idempotently, that its workload
        and ledger rows are gone (a replica workflow that was terminated never tore down)."""
        replica.phase, replica.reason = "removing", reason
        try:
            await workflow.get_external_workflow_handle(replica.workflow_id).cancel()
        except Exception:  # noqa: BLE001 - it has already ended; the clean-up below still runs
            pass
        else:
            try:
                await workflow.wait_condition(
                    lambda: replica.phase in ("removed", "failed"),
                    timeout=timedelta(seconds=self.input.timing.removal_wait_seconds),
                )
            except TimeoutError:
                workflow.logger.warning("replica %s did not report its teardown; cleaning up", replica.name)
        await self.control(
            steps.delete_workload,
            WorkloadRef(namespace=self.namespace, cluster=replica.cluster, name=replica.name),
            summary=f"delete {replica.name}",
        )
        await self.control(
            steps.release_replica,
            ReplicaRef(namespace=self.namespace, name=replica.name),
            summary=f"release ledger of {replica.name}",
        )
        self.replicas.pop(replica.name, None)

    async def teardown(self) -> None:
        """Remove every replica, then the deployment's row. Runs to completion even while being cancelled."""
        await self.publish("deleting")
        await asyncio.gather(*(self.remove_replica(r, "deployment deleted") for r in list(self.replicas.values())))
        await self.control(steps.delete_deployment_record, DeploymentRef(namespace=self.namespace, name=self.name))
        self.status.available = self.status.scheduled = 0
        await self.publish("deleted", record=False)

    async def control(self, step: Callable[..., Awaitable[R]], argument: BaseModel, summary: str | None = None) -> R:
        """A control step of the deployment's own, on the control queue (workflows/control_calls.py)."""
        return await control_calls.on_control(
            self.input.queues, step, argument, start_to_close=control_calls.DEPLOYMENT_TIMEOUT, summary=summary
        )

    # -- status, UI and the deployment's row --------------------------------------------------------------------------

    def live_replicas(self) -> list[ReplicaView]:
        return [r for r in self.replicas.values() if r.phase in ("starting", "ready")]

    def take_status(self, plan: FleetPlan) -> None:
        s = plan.status
        self.status.desired, self.status.min_replicas, self.status.scheduled = s.desired, s.min_replicas, s.available
        self.status.phase, self.status.reason, self.status.message = s.phase.value, s.reason, s.message
        self.status.clusters = [
            ClusterNote(cluster=c.cluster, reason=c.reason.value, message=c.message) for c in s.clusters
        ]

    def refresh_replicas(self) -> None:
        self.status.replicas = [
            ReplicaSummary(
                name=r.name,
                cluster=r.cluster,
                index=r.index,
                phase=r.phase,
                workflow_id=r.workflow_id,
                pools={u.engine: u.pool for u in r.engines},
                nodes=sum(u.nodes for u in r.engines),
                gateway_address=r.gateway_address,
                reason=r.reason,
            )
            for r in sorted(self.replicas.values(), key=lambda r: (r.cluster, r.index))
        ]
        self.status.available = sum(1 for r in self.replicas.values() if r.phase == "ready")

    async def publish(self, state: DeploymentState, record: bool = True) -> None:
        self.status.state = state
        self.refresh_replicas()
        workflow.upsert_search_attributes(
            [sa.STATE.value_set(self.status.phase or state if state == "steady" else state)]
        )
        workflow.set_current_details(self.story())
        if record:
            await self.control(
                steps.record_deployment_status,
                DeploymentStatusRecord(
                    namespace=self.namespace, name=self.name, status=self.status.model_dump(mode="json")
                ),
            )

    def story(self) -> str:
        s = self.status
        lines = [
            f"**{s.state}** - deployment `{self.qualified_name}`: {s.available} of {s.desired} replicas available, "
            f"{s.scheduled} scheduled" + (f" ({s.phase}: {s.message})" if s.phase else ""),
        ]
        if s.replicas:
            lines += ["", "| replica | cluster | pools | phase |", "| --- | --- | --- | --- |"]
            lines += [
                f"| {r.name} | {r.cluster} | {', '.join(f'{e}: {p}' for e, p in r.pools.items())} | {r.phase} |"
                for r in s.replicas
            ]
        if s.clusters:
            lines += ["", "Why not more:"] + [f"- {c.cluster}: {c.reason}: {c.message}" for c in s.clusters]
        if s.recent_failures:
            lines += ["", "Recent failures:"] + [f"- {f}" for f in s.recent_failures[-3:]]
        if s.recent_removals:
            lines += ["", "Recently removed:"] + [f"- {r}" for r in s.recent_removals[-3:]]
        return "\n".join(lines)

    @property
    def qualified_name(self) -> str:
        """The name as an operator tells it apart: `<namespace>/<name>` outside `default`."""
        return qualified_name(self.name, self.namespace)

    # -- continue-as-new ----------------------------------------------------------------------------------------------

    def should_continue_as_new(self) -> bool:
        limit = self.input.timing.reconciles_per_run
        return workflow.info().is_continue_as_new_suggested() or (
            limit is not None and self.reconciles_this_run >= limit
        )

    def carried_over(self) -> DeploymentInput:
        return self.input.model_copy(
            update={
                "manifest": self.manifest,
                "replicas": list(self.replicas.values()),
                "status": self.status,
                "delete_requested": self.delete_requested,
                "reconcile_pending": self.dirty or self.report_pending or self.moving,
            }
        )

    # -- messages -----------------------------------------------------------------------------------------------------

    @workflow.query
    def status_query(self) -> DeploymentStatus:
        self.refresh_replicas()
        return self.status

    @workflow.update
    async def apply_spec(self, update: SpecUpdate) -> DeploymentStatus:
        """Take a new spec; the next reconcile acts on it."""
        self.manifest = update.manifest
        self.dirty = True
        return self.status

    @apply_spec.validator
    def validate_apply_spec(self, update: SpecUpdate) -> None:
        if self.delete_requested:
            raise ValueError(f"deployment {self.qualified_name} is being deleted")
        check_manifest(update.manifest, self.name, self.namespace)  # raises InvalidSpec (a ValueError) naming the field

    @workflow.update
    async def delete(self, request: DeleteRequest) -> DeploymentStatus:
        self.delete_requested = True
        return self.status

    @delete.validator
    def validate_delete(self, request: DeleteRequest) -> None:
        if self.delete_requested:
            raise ValueError(f"deployment {self.qualified_name} is already being deleted")

    @workflow.signal
    def inventory_changed(self, change: InventoryChanged) -> None:
        self.dirty = True

    @workflow.signal
    def replica_report(self, report: ReplicaReport) -> None:
        replica = self.replicas.get(report.name)
        if replica is None:
            return
        replica.phase, replica.reason = report.phase, report.reason
        if report.phase == "failed":
            self.status.recent_failures = [*self.status.recent_failures, f"{report.name}: {report.reason}"][
                -FAILURES_KEPT:
            ]
            del self.replicas[report.name]  # its workflow has already compensated
            if report.conflict:
                self.replan_after_conflict = True
                self.dirty = True
        elif report.phase == "ready" and self.moving:
            self.dirty = True  # a replacement is ready: the next replica may move
        self.report_pending = True
        self.refresh_replicas()
        workflow.set_current_details(self.story())


def initial_search_attributes() -> TypedSearchAttributes:
    return TypedSearchAttributes([SearchAttributePair(sa.KIND, "deployment"), SearchAttributePair(sa.STATE, "pending")])


__all__ = ["DeploymentWorkflow", "initial_search_attributes"]
