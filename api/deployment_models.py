"""Responses of `/v1/deployments` (the request body is the ModelDeployment manifest itself)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.deployment.messages import ClusterNote, ReplicaSummary


class DeploymentAccepted(BaseModel):
    name: str
    created: bool = Field(description="True when this PUT created the deployment, false when it updated the spec.")
    workflow_id: str


class DeploymentView(BaseModel):
    """A deployment's status: desired vs available, where each replica runs, and why there are not more."""

    name: str
    namespace: str
    state: str = Field(description="pending, reconciling, steady, deleting or deleted.")
    desired: int
    min_replicas: int | None
    scheduled: int = Field(description="Replicas the last plan found a place for.")
    available: int = Field(description="Replicas whose workload is ready.")
    phase: str | None = Field(description="FullyScheduled, PartiallyScheduled or ScheduleFailed (the last plan).")
    reason: str | None
    message: str = Field(description="The explanation, e.g. `2 of 3 replicas scheduled (checked 2 clusters)`.")
    clusters: list[ClusterNote] = Field(description="Per cluster that took no more replicas: reason and message.")
    replicas: list[ReplicaSummary]
    recent_failures: list[str]
    recent_removals: list[str] = Field(
        default_factory=list,
        description="`<replica>: <reason>: <why>` of replicas the deployment removed lately, e.g. moved off a node "
        "tainted NoExecute (`UntoleratedNoExecuteTaint`).",
    )
    workflow_id: str
    live: bool = Field(description="Whether the running workflow answered; false: the last status it recorded.")


class DeploymentSummary(BaseModel):
    namespace: str
    name: str
    state: str | None
    desired: int
    available: int
    phase: str | None
    message: str


class DeploymentList(BaseModel):
    deployments: list[DeploymentSummary]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; null on the last page."
    )
