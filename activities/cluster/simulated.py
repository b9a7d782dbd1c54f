"""A simulated Kubernetes cluster behind the ClusterDriver interface, with real state on disk.

Layout under the state directory (`<state dir>/clusters` for `berth up`):

    <cluster>/workloads/<replica>.json   one file per applied workload of the `default` namespace (written
                                         atomically: write, fsync, rename)
    <cluster>/workloads/<namespace>/<replica>.json   the same for a workload of another namespace
    <cluster>/simulation.json            optional faults, e.g. {"ready": false}, {"neverReady": true},
                                         {"bootSeconds": 5}, {"gatewayAddress": null}

A workload becomes ready `bootSeconds` after it was applied (the pods' image pull and model load), unless the
cluster's simulation says `neverReady`. A cluster is Ready with a gateway address `<cluster>.gateway.berth.internal`
unless its simulation says otherwise. Tests and operators flip faults by writing the simulation file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from activities.cluster.workload import Workload
from contracts.cluster import ClusterObservation, WorkloadReadiness
from contracts.manifest import DEFAULT_NAMESPACE

DEFAULT_BOOT_SECONDS = 1.0


class ClusterSimulation(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    ready: bool = True
    gateway_address: str | None = Field(default="", alias="gatewayAddress")  # "": the default address
    boot_seconds: float | None = Field(default=None, alias="bootSeconds")
    never_ready: bool = Field(default=False, alias="neverReady")


class StoredWorkload(BaseModel):
    workload: Workload
    applied_at: float  # epoch seconds


class SimulatedClusterDriver:
    def __init__(
        self, state_dir: Path, boot_seconds: float = DEFAULT_BOOT_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self.state_dir = state_dir
        self.boot_seconds = boot_seconds
        self.clock = clock

    # -- files ------------------------------------------------------------------------------------------------------

    def _workloads(self, cluster: str) -> Path:
        return self.state_dir / cluster / "workloads"

    def _path(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> Path:
        directory = self._workloads(cluster)
        return (directory if namespace == DEFAULT_NAMESPACE else directory / namespace) / f"{name}.json"

    def simulation(self, cluster: str) -> ClusterSimulation:
        try:
            return ClusterSimulation.model_validate_json((self.state_dir / cluster / "simulation.json").read_text())
        except (FileNotFoundError, ValidationError, json.JSONDecodeError):
            return ClusterSimulation()

    def set_simulation(self, cluster: str, **faults: Any) -> None:
        """Write the cluster's faults (camelCase keys as in the file)."""
        path = self.state_dir / cluster / "simulation.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, json.dumps(faults))

    def stored(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> StoredWorkload | None:
        try:
            return StoredWorkload.model_validate_json(self._path(cluster, name, namespace).read_text())
        except (FileNotFoundError, ValidationError, json.JSONDecodeError):
            return None

    def workload_files(self) -> list[Path]:
        return sorted([*self.state_dir.glob("*/workloads/*.json"), *self.state_dir.glob("*/workloads/*/*.json")])

    # -- the interface ----------------------------------------------------------------------------------------------

    def apply_workload(self, workload: Workload) -> None:
        existing = self.stored(workload.cluster, workload.name, workload.namespace)
        if existing is not None and existing.workload == workload:
            return
        record = StoredWorkload(workload=workload, applied_at=existing.applied_at if existing else self.clock())
        path = self._path(workload.cluster, workload.name, workload.namespace)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, record.model_dump_json(indent=2))

    def delete_workload(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        try:
            self._path(cluster, name, namespace).unlink()
        except FileNotFoundError:
            return False
        return True

    def workload_ready(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> WorkloadReadiness:
        stored = self.stored(cluster, name, namespace)
        if stored is None:
            return WorkloadReadiness(exists=False, ready=False, message=f"workload {name} does not exist on {cluster}")
        simulation = self.simulation(cluster)
        total = len(stored.workload.pods)
        if simulation.never_ready:
            return WorkloadReadiness(
                exists=True, ready=False, pods_total=total, message="pods stay Pending (simulated: neverReady)"
            )
        boot = simulation.boot_seconds if simulation.boot_seconds is not None else self.boot_seconds
        waited = self.clock() - stored.applied_at
        if waited < boot:
            return WorkloadReadiness(
                exists=True, ready=False, pods_total=total, message=f"pods starting ({waited:.1f}s of {boot:g}s)"
            )
        return WorkloadReadiness(exists=True, ready=True, pods_ready=total, pods_total=total, message="all pods ready")

    def observe_cluster(self, cluster: str) -> ClusterObservation:
        simulation = self.simulation(cluster)
        gateway = simulation.gateway_address
        if gateway == "":
            gateway = f"{cluster}.gateway.berth.internal"
        return ClusterObservation(
            cluster=cluster,
            ready=simulation.ready,
            gateway_address=gateway,
            message="Ready" if simulation.ready else f"simulated fault: {cluster}/simulation.json sets ready false",
        )


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    with partial.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
