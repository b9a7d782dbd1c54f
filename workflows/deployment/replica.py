"""One replica of a ModelDeployment, from ledger to ready workload and back (docs/design.md section 3).

    1. record_replica        the replica's row and its pool ledger rows, one transaction, re-checked under lock;
                             a pool it would overcommit is a LedgerConflict: report it, the deployment re-plans
    2. apply_workload        render the pods (pinned to each member's pool) and DRA claims, apply on the cluster
    3. wait_workload_ready   heartbeating probes, in windows, up to the readiness timeout
    4. ready                 report to the deployment, then hold until cancelled (the deployment removes it)
    teardown / failure       delete the workload, release the ledger rows (shielded, newest first), report

Workflow id `replica/<deployment>/<cluster>/<index>` in the `default` namespace and
`replica/<namespace>/<deployment>/<cluster>/<index>` in any other: Modelplane's index is per cluster, so the cluster
is part of the id, and the same deployment name in two namespaces is two deployments. The replica never changes cluster; moving is delete plus create. It is started with parent close policy
ABANDON (the deployment continues-as-new under it) and reports to the deployment by signal, by workflow id.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    # The fleet's models check carried blocks with jsonschema, imported when first needed (fleet/openapi.py): that
    # can be while this workflow's input is decoded, so it must be a pass-through module here, or the sandbox
    # imports it afresh under its restrictions and the import fails (`platform.python_implementation`).
    import jsonschema  # noqa: F401

    from contracts import steps
    from contracts.cluster import WorkloadReadiness
    from contracts.deployment import (
        LEDGER_CONFLICT,
        REPLICA_NOT_READY,
        ApplyWorkloadInput,
        RecordReplicaInput,
        ReplicaRef,
        ReplicaStateInput,
        WaitWorkloadInput,
        WorkloadRef,
    )
    from contracts.manifest import DEFAULT_NAMESPACE
    from workflows import control_calls
    from workflows import search_attributes as sa
    from workflows.cancellation import wait_unless_cancelled
    from workflows.deployment.messages import ReplicaInput, ReplicaReport
    from workflows.saga import Saga, shielded


def replica_workflow_id(deployment: str, cluster: str, index: int, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Unchanged for `default` (the replicas running before namespaces keep their ids); names never hold a slash,
    so the namespaced form cannot collide with it."""
    if namespace == DEFAULT_NAMESPACE:
        return f"replica/{deployment}/{cluster}/{index}"
    return f"replica/{namespace}/{deployment}/{cluster}/{index}"


@workflow.defn(name="ModelReplica")
class ReplicaWorkflow:
    @workflow.init
    def __init__(self, input: ReplicaInput) -> None:
        self.input = input
        self.phase = "starting"
        self.detail = "recording the ledger"

    @workflow.run
    async def run(self, input: ReplicaInput) -> str:
        saga = Saga()
        try:
            await self.record(saga)
            await self.apply(saga)
            await self.wait_ready()
            await self.set_phase("ready", "all pods ready", db_state="ready")
            await self.report("ready")
            await wait_unless_cancelled(lambda: False)  # hold until the deployment removes it (cancellation)
        except GeneratorExit:
            raise  # the worker is dropping this run from memory; it resumes from its history, undo included
        except BaseException as error:
            cancelled = is_cancelled_exception(error)
            reason = "removed by its deployment" if cancelled else _reason(error)
            conflict = _is_conflict(error)

            async def undo() -> None:
                await self.set_phase("removing", reason)
                await saga.compensate()
                await self.set_phase("removed" if cancelled else "failed", reason)
                await self.report("removed" if cancelled else "failed", reason, conflict)

            await shielded(undo())
            if cancelled:
                raise
            raise ApplicationError(
                reason, type=LEDGER_CONFLICT if conflict else REPLICA_NOT_READY, non_retryable=True
            ) from error
        return self.phase  # unreachable: a replica only ends by removal or failure

    async def record(self, saga: Saga) -> None:
        i = self.input
        # Registered first: the transaction may commit and its activity still time out.
        saga.add("release_replica", self.release)
        await control_calls.on_control(
            i.queues,
            steps.record_replica,
            RecordReplicaInput(
                namespace=i.namespace,
                deployment=i.deployment,
                name=i.name,
                cluster=i.cluster,
                index=i.index,
                manifest=i.manifest,
                usage=i.usage,
            ),
            summary=f"ledger for {i.name}",
        )
        await self.set_phase("starting", "ledger recorded; applying the workload")

    async def apply(self, saga: Saga) -> None:
        i = self.input
        saga.add("delete_workload", self.delete_workload)  # before the apply: a cut-short apply may have created it
        await control_calls.on_control(
            i.queues,
            steps.apply_workload,
            ApplyWorkloadInput(manifest=i.manifest),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"apply {i.name} on {i.cluster}",
        )
        await self.set_phase("starting", "workload applied; waiting for its pods", db_state="applied")

    async def wait_ready(self) -> None:
        i, timing = self.input, self.input.timing
        deadline = workflow.now() + timedelta(seconds=timing.readiness_timeout_seconds)
        while True:
            readiness: WorkloadReadiness = await control_calls.on_control(
                i.queues,
                steps.wait_workload_ready,
                WaitWorkloadInput(
                    namespace=i.namespace,
                    cluster=i.cluster,
                    name=i.name,
                    window_seconds=timing.readiness_window_seconds,
                    poll_seconds=timing.readiness_poll_seconds,
                ),
                start_to_close=timedelta(seconds=timing.readiness_window_seconds + 30),  # one window and a margin
                heartbeat=timedelta(seconds=10),  # it heartbeats while it probes: a lost worker is noticed
                summary=f"wait for {i.name}",
            )
            if readiness.ready:
                return
            self.detail = readiness.message
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                raise ApplicationError(
                    f"replica {i.name} on {i.cluster} not ready after {timing.readiness_timeout_seconds:g}s: "
                    f"{readiness.message}",
                    type=REPLICA_NOT_READY,
                    non_retryable=True,
                )
            await workflow.sleep(min(timing.readiness_poll_seconds, remaining))

    # -- compensations ------------------------------------------------------------------------------------------------

    async def release(self) -> None:
        await control_calls.on_control(
            self.input.queues,
            steps.release_replica,
            ReplicaRef(namespace=self.input.namespace, name=self.input.name),
            summary=f"release ledger of {self.input.name}",
        )

    async def delete_workload(self) -> None:
        await control_calls.on_control(
            self.input.queues,
            steps.delete_workload,
            WorkloadRef(namespace=self.input.namespace, cluster=self.input.cluster, name=self.input.name),
            summary=f"delete {self.input.name}",
        )

    # -- reporting --------------------------------------------------------------------------------------------------

    async def report(self, phase: str, reason: str | None = None, conflict: bool = False) -> None:
        """Tell the deployment; a deployment that has already ended has nothing left to hear."""
        try:
            await workflow.get_external_workflow_handle(self.input.deployment_workflow_id).signal(
                "replica_report", ReplicaReport(name=self.input.name, phase=phase, reason=reason, conflict=conflict)
            )
        except Exception:  # noqa: BLE001 - the deployment is gone (deleted); the replica's own work is done
            workflow.logger.info("deployment %s did not take the report", self.input.deployment_workflow_id)

    async def set_phase(self, phase: str, detail: str, db_state: str | None = None) -> None:
        self.phase, self.detail = phase, detail
        workflow.upsert_search_attributes([sa.STATE.value_set(phase)])
        workflow.set_current_details(
            f"**{phase}** - replica `{self.input.name}` of deployment `{self.input.deployment}` on cluster "
            f"`{self.input.cluster}` (index {self.input.index})\n\n"
            + "\n".join(
                f"- engine {u.engine}: pool {u.pool}, {u.nodes} node(s)"
                + (f", {u.gpus} GPU(s) of shared nodes" if u.gpus else "")
                for u in self.input.usage
            )
            + f"\n\n{detail}"
        )
        if db_state is not None:
            await control_calls.on_control(
                self.input.queues,
                steps.set_replica_state,
                ReplicaStateInput(namespace=self.input.namespace, name=self.input.name, state=db_state),
            )

    @workflow.query
    def phase_query(self) -> str:
        return self.phase


def _is_conflict(error: BaseException) -> bool:
    cause = error.cause if isinstance(error, ActivityError) else error
    return isinstance(cause, ApplicationError) and cause.type == LEDGER_CONFLICT


def _reason(error: BaseException) -> str:
    cause = error.cause if isinstance(error, ActivityError) and error.cause is not None else error
    return getattr(cause, "message", None) or str(cause)
