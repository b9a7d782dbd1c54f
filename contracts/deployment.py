"""The typed messages between the deployment and replica workflows and their activities (one pydantic model per
argument and result, docs/design.md "Temporal practice"). Manifests travel as the JSON objects a user would write (camelCase), so what
the workflow history shows is what `kubectl get -o yaml` would.

Deployments and their replicas are namespaced (Modelplane's kinds are): every reference carries the namespace,
`default` when left out, which is also what histories recorded before namespaces replay with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contracts.fleet_plan import FleetPlan
from contracts.manifest import DEFAULT_NAMESPACE

# The deployment workflow's own state (BerthState while it runs; the API's `state`): `deleted` is its last.
DEPLOYMENT_STATES = ("pending", "reconciling", "steady", "deleting", "deleted")
DEPLOYMENT_FINAL_STATES = ("deleted",)

LEDGER_CONFLICT = "LedgerConflict"
REPLICA_NOT_READY = "ReplicaNotReady"


class Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class PlanDeploymentInput(Model):
    deployment: dict[str, Any]  # the ModelDeployment manifest
    own_replicas: list[dict[str, Any]] = Field(
        default_factory=list, description="This deployment's replicas as the workflow holds them (ModelReplica)."
    )


class PlannedDeployment(Model):
    plan: FleetPlan
    new_replicas: list[dict[str, Any]]  # ModelReplica manifests, in the order of plan.new
    clusters_observed: int


class DeploymentStatusRecord(Model):
    namespace: str = DEFAULT_NAMESPACE
    name: str
    status: dict[str, Any]


class DeploymentRef(Model):
    namespace: str = DEFAULT_NAMESPACE
    name: str


class EngineUsage(Model):
    engine: str
    pool: str
    nodes: int  # whole nodes
    gpus: int = 0  # devices held on nodes shared with other instances (fitGranularity Gpu)


class RecordReplicaInput(Model):
    namespace: str = DEFAULT_NAMESPACE
    deployment: str
    name: str
    cluster: str
    index: int
    manifest: dict[str, Any]
    usage: list[EngineUsage]


class ReplicaStateInput(Model):
    namespace: str = DEFAULT_NAMESPACE
    name: str
    state: str


class ReplicaRef(Model):
    namespace: str = DEFAULT_NAMESPACE
    name: str


class ApplyWorkloadInput(Model):
    manifest: dict[str, Any]  # the ModelReplica; the activity renders its workload


class WorkloadRef(Model):
    namespace: str = DEFAULT_NAMESPACE
    cluster: str
    name: str


class WaitWorkloadInput(Model):
    namespace: str = DEFAULT_NAMESPACE
    cluster: str
    name: str
    window_seconds: float = 5.0
    poll_seconds: float = 0.5


class ReplicaSummary(BaseModel):
    name: str
    cluster: str
    index: int
    phase: str
    pools: dict[str, str]  # engine -> pool
    nodes: int
    gateway_address: str | None = None
    workflow_id: str
    reason: str | None = None


class ClusterNote(BaseModel):
    cluster: str
    reason: str
    message: str
