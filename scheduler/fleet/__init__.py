"""The fleet scheduler for ModelDeployments (seeds 000, 001, 002, 003). See README.md in this folder."""

from scheduler.fleet.manifests import manifest_dict, replica_manifest
from scheduler.fleet.results import (
    ClusterReason,
    ClusterVerdict,
    DeploymentStatus,
    DroppedReplica,
    DropReason,
    EnginePlacement,
    FleetPlan,
    MemberPlacement,
    Phase,
    ReplicaPlacement,
    RequestPlacement,
    StatusReason,
)
from scheduler.fleet.schedule import schedule_deployment

__all__ = [
    "ClusterReason",
    "ClusterVerdict",
    "DeploymentStatus",
    "DropReason",
    "DroppedReplica",
    "EnginePlacement",
    "FleetPlan",
    "MemberPlacement",
    "Phase",
    "ReplicaPlacement",
    "RequestPlacement",
    "StatusReason",
    "manifest_dict",
    "replica_manifest",
    "schedule_deployment",
]
