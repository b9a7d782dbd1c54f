"""The activities the workflows call, declared once: name, argument, result.

A workflow calls an activity by one of these functions (`workflow.execute_activity(steps.create_vm, spec, ...)`),
so the call is typed (the result type comes from the declaration) and "go to definition" lands here, where each
declaration names the module that implements it. The implementations live in two processes that a workflow module
must not import: the control worker's activities (`activities/control/`, with SQLAlchemy) and the node agent's
(`agent/activities.py`, on the GPU host), and the cluster drivers' (`activities/cluster/`). Each implementation is registered under the same name with the same
types; `tests/workflows/test_step_declarations.py` holds every declaration against its implementation.

The bodies never run: a worker registers the implementations, never these.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import activity

from contracts.allocation import (
    AdmitInput,
    AdmitResult,
    AuditTrail,
    CandidateList,
    ClaimInput,
    EnterQueueInput,
    FindCandidatesInput,
    LeaseRef,
    LeaveQueueInput,
    PlacementChoice,
    PlanInput,
    PlanOutcome,
    QuarantineInput,
    Readiness,
    ReadinessInput,
    ReleaseClaimsInput,
    ReservationRef,
    ReservationStart,
    SlotsInput,
    TeardownInput,
    TeardownResult,
    VmInfo,
    VmSpec,
)
from contracts.audit import (
    ApplyRepair,
    AssessInput,
    AuditReport,
    AuditTargets,
    FinishAudit,
    HostState,
    IdleCheck,
    Repair,
    WipeRequest,
    WipeResult,
)
from contracts.cluster import WorkloadReadiness
from contracts.deployment import (
    ApplyWorkloadInput,
    DeploymentRef,
    DeploymentStatusRecord,
    PlanDeploymentInput,
    PlannedDeployment,
    RecordReplicaInput,
    ReplicaRef,
    ReplicaStateInput,
    WaitWorkloadInput,
    WorkloadRef,
)

_DECLARATION = "a declaration: the worker runs the implementation registered under this name"

# -- control steps: the control worker (activities/control/), local activities of the allocation workflow ----------


@activity.defn(name="choose_placement")
async def choose_placement(request: FindCandidatesInput) -> PlacementChoice:
    """Region and cluster levels on one snapshot (activities/control/placement.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="find_candidates")
async def find_candidates(request: FindCandidatesInput) -> CandidateList:
    """The cluster level alone, in the chosen region: the re-plan (activities/control/placement.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="enter_queue")
async def enter_queue(request: EnterQueueInput) -> AdmitResult:
    """Wait in a region's queue, keeping its place on a re-entry, and walk it (activities/control/admission.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="leave_queue")
async def leave_queue(request: LeaveQueueInput) -> AdmitResult:
    """Out of the queue, and the region's queue walked again (activities/control/admission.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="admit_queued")
async def admit_queued(request: AdmitInput) -> AdmitResult:
    """The admission pass over regions' queues, waking who can be placed (activities/control/admission.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="record_claims")
async def record_claims(claim: ClaimInput) -> list[int]:
    """Claim the planned slots in PostgreSQL, within quota (activities/control/claims.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="start_reservation")
async def start_reservation(reservation: ReservationRef) -> ReservationStart:
    """A reservation's start: `started`, and who must leave its node (activities/control/reservations.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="finish_reservation")
async def finish_reservation(reservation: ReservationRef) -> None:
    """A reservation's end: ended, cancelled or failed (activities/control/reservations.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="release_claims")
async def release_claims(request: ReleaseClaimsInput) -> int:
    """Give an attempt's claims (or all of them) back (activities/control/claims.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="quarantine_slots")
async def quarantine_slots(request: QuarantineInput) -> int:
    """Keep slots out of placement until their wipe is confirmed (activities/control/claims.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="unquarantine_slots")
async def unquarantine_slots(request: SlotsInput) -> int:
    """Return wiped slots to placement (activities/control/claims.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="record_trail")
async def record_trail(trail: AuditTrail) -> None:
    """Write the allocation's unwritten audit steps (activities/control/records.py)."""
    raise NotImplementedError(_DECLARATION)


# -- reconciler steps: the control worker (activities/control/audit.py) -----------------------------------------------


@activity.defn(name="audit_targets")
async def audit_targets() -> AuditTargets:
    """The hosts to audit and the reconciler's settings."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="audit_assess")
async def audit_assess(request: AssessInput) -> AuditReport:
    """Compare the hosts' state with the claims and record the findings."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="audit_confirm_idle")
async def audit_confirm_idle(check: IdleCheck) -> None:
    """Refuse a repair when the allocation has come back to life since the assessment."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="audit_apply_repair")
async def audit_apply_repair(request: ApplyRepair) -> Repair:
    """Record a repair's outcome (and what it changed in PostgreSQL)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="audit_finish")
async def audit_finish(request: FinishAudit) -> datetime | None:
    """Close the audit run."""
    raise NotImplementedError(_DECLARATION)


# -- deployment steps: the control worker (activities/control/deployments.py, the ledger; activities/cluster/, the
# cluster drivers), for the ModelDeployment and replica workflows ---------------------------------------------------


@activity.defn(name="plan_deployment")
async def plan_deployment(input: PlanDeploymentInput) -> PlannedDeployment:
    """The fleet scheduler's plan for the deployment on the fleet as PostgreSQL has it."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="record_deployment_status")
async def record_deployment_status(record: DeploymentStatusRecord) -> None:
    """The deployment's status, for the API and `berth deploy`."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="delete_deployment_record")
async def delete_deployment_record(ref: DeploymentRef) -> None:
    """The deployment's row, once every replica is gone."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="record_replica")
async def record_replica(input: RecordReplicaInput) -> bool:
    """Charge the replica to the pools' ledger; False when the ledger has no room (it never overcommits)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="set_replica_state")
async def set_replica_state(input: ReplicaStateInput) -> None:
    """The replica's state in its row."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="release_replica")
async def release_replica(ref: ReplicaRef) -> bool:
    """Give the replica's ledger charge back."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="apply_workload")
async def apply_workload(input: ApplyWorkloadInput) -> int:
    """Render the replica and apply its objects to its cluster (activities/cluster/activities.py)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="delete_workload")
async def delete_workload(ref: WorkloadRef) -> bool:
    """Delete everything of the replica's workload on its cluster."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="wait_workload_ready")
async def wait_workload_ready(input: WaitWorkloadInput) -> WorkloadReadiness:
    """Probe the workload's readiness for one window."""
    raise NotImplementedError(_DECLARATION)


# -- node steps: the node agent of one host (agent/activities.py), on the node's own task queue ----------------------


@activity.defn(name="plan_bundles")
def plan_bundles(request: PlanInput) -> PlanOutcome:
    """Plan bundles on the host's slots and take the host-local lease."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="release_lease")
def release_lease(ref: LeaseRef) -> bool:
    """Give the host-local lease back."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="create_vm")
def create_vm(spec: VmSpec) -> VmInfo:
    """Create the VM with the bundles' devices passed through (idempotent per allocation)."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="wait_ready")
def wait_ready(request: ReadinessInput) -> Readiness:
    """Watch the readiness gates for one window."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="destroy_vm")
def destroy_vm(request: TeardownInput) -> TeardownResult:
    """Destroy the VM and wipe its slots."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="host_state")
def host_state() -> HostState:
    """What the host runs and holds now, for the reconciler."""
    raise NotImplementedError(_DECLARATION)


@activity.defn(name="wipe_slots")
def wipe_slots(request: WipeRequest) -> WipeResult:
    """Wipe slots that nothing holds (a reconciler repair)."""
    raise NotImplementedError(_DECLARATION)
