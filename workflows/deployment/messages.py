"""What goes into the ModelDeployment and replica workflows, what they answer, and the messages between them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from contracts.deployment import DEPLOYMENT_STATES, ClusterNote, EngineUsage, ReplicaSummary
from contracts.manifest import DEFAULT_NAMESPACE
from contracts.task_queues import Queues

# The deployment workflow's own state (BerthState while it runs); the scheduling phase is separate. The workflow
# publishes these by name, checked against this one list (contracts.deployment.DEPLOYMENT_STATES).
DeploymentState = Literal[DEPLOYMENT_STATES]  # type: ignore[valid-type]
ReplicaPhase = Literal["starting", "ready", "failed", "removing", "removed"]


def qualified_name(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """A deployment as an operator tells it apart: `<namespace>/<name>` outside `default`."""
    return name if namespace == DEFAULT_NAMESPACE else f"{namespace}/{name}"


class DeploymentTiming(BaseModel):
    """How often and how long the workflows wait. Defaults suit real clusters; tests shorten them."""

    model_config = ConfigDict(frozen=True)

    resync_seconds: PositiveFloat = Field(default=300.0, description="Reconcile at least this often.")
    readiness_timeout_seconds: PositiveFloat = Field(
        default=900.0, description="A replica not ready by then is torn down (and placed again at a later pass)."
    )
    readiness_window_seconds: PositiveFloat = 5.0
    readiness_poll_seconds: PositiveFloat = 1.0
    conflict_backoff_seconds: PositiveFloat = Field(
        default=1.0, description="Pause before re-planning after the ledger refused a replica."
    )
    removal_wait_seconds: PositiveFloat = Field(
        default=120.0, description="How long to wait for a replica's own teardown before cleaning up after it."
    )
    reconciles_per_run: PositiveInt | None = Field(
        default=None, description="Continue-as-new after this many reconciles (besides when Temporal suggests it)."
    )


class ReplicaView(BaseModel):
    """One replica as its deployment sees it; the manifest is what the ledger charges it by."""

    name: str
    cluster: str
    index: int
    workflow_id: str
    gateway_address: str | None = None
    engines: list[EngineUsage]
    phase: ReplicaPhase = "starting"
    reason: str | None = None
    manifest: dict[str, Any]


class DeploymentStatus(BaseModel):
    """The deployment as an operator reads it: desired vs available, where each replica runs, and why not more."""

    name: str
    namespace: str = DEFAULT_NAMESPACE
    state: DeploymentState = "pending"
    desired: int = 0
    min_replicas: int | None = None
    scheduled: int = 0  # replicas the last plan found a place for
    available: int = 0  # replicas whose workload is ready
    phase: str | None = None  # FullyScheduled, PartiallyScheduled or ScheduleFailed (last plan)
    reason: str | None = None
    message: str = ""
    clusters: list[ClusterNote] = Field(default_factory=list)
    replicas: list[ReplicaSummary] = Field(default_factory=list)
    recent_failures: list[str] = Field(default_factory=list)
    # `<replica>: <reason>: <why>` of the replicas the plan removed last (moved off a node tainted NoExecute,
    # scaled down, a cluster gone...), so the reason outlives the replica.
    recent_removals: list[str] = Field(default_factory=list)
    reconciles: int = 0


class DeploymentInput(BaseModel):
    name: str
    # Histories from before namespaces carry none: those deployments were all in "default".
    namespace: str = DEFAULT_NAMESPACE
    manifest: dict[str, Any]  # the ModelDeployment, normalised (workflows.deployment.spec.normalised)
    timing: DeploymentTiming = Field(default_factory=DeploymentTiming)
    queues: Queues = Field(default_factory=Queues)
    # Carried over by continue-as-new:
    replicas: list[ReplicaView] = Field(default_factory=list)
    status: DeploymentStatus | None = None
    delete_requested: bool = False
    reconcile_pending: bool = True  # a fresh deployment plans at once; a continued run only if work was waiting


class SpecUpdate(BaseModel):
    manifest: dict[str, Any]


class DeleteRequest(BaseModel):
    reason: str | None = None


class InventoryChanged(BaseModel):
    reason: str | None = None


class ReplicaReport(BaseModel):
    """What a replica workflow tells its deployment: ready, failed (compensated) or removed (torn down)."""

    name: str
    phase: ReplicaPhase
    reason: str | None = None
    conflict: bool = False  # the ledger refused it: re-plan soon


class ReplicaInput(BaseModel):
    namespace: str = DEFAULT_NAMESPACE
    deployment: str
    deployment_workflow_id: str
    name: str
    cluster: str
    index: int
    manifest: dict[str, Any]
    usage: list[EngineUsage]
    timing: DeploymentTiming = Field(default_factory=DeploymentTiming)
    queues: Queues = Field(default_factory=Queues)
