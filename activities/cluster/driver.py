"""What the control plane needs from a Kubernetes cluster that serves ModelDeployments, as one small interface.

A real driver talks to the cluster's API server (apply the replica's Deployment or LeaderWorkerSet and its
ResourceClaimTemplates with server-side apply, delete them by the replica's label, read pod readiness, read node
and gateway status); the simulated one (simulated.py) keeps the same state in files. Every method is idempotent: activities are retried, and a retry must change nothing twice.
"""

from __future__ import annotations

from typing import Protocol

from activities.cluster.workload import Workload
from contracts.cluster import ClusterObservation, WorkloadReadiness
from contracts.manifest import DEFAULT_NAMESPACE


class ClusterDriver(Protocol):
    def apply_workload(self, workload: Workload) -> None:
        """Create the replica's pods and claims, or leave them as they are if they already exist."""
        ...

    def delete_workload(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Delete everything of the named workload; True if there was something to delete."""
        ...

    def workload_ready(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> WorkloadReadiness:
        """Probe once: are all of the workload's pods running and ready?"""
        ...

    def observe_cluster(self, cluster: str) -> ClusterObservation:
        """The cluster's Ready condition and gateway address as they are now."""
        ...
