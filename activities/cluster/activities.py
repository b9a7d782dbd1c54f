"""Thin activities over a ClusterDriver: apply a replica's workload, delete it, and wait for it to be ready.

The driver calls are blocking (file or HTTP I/O), so they run in a thread. `wait_workload_ready` probes for a
bounded window, heartbeating every probe (that is also how a cancel reaches it), and reports back; the replica
workflow loops over windows up to its readiness timeout, so no single activity runs long.
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cluster.driver import ClusterDriver
from activities.cluster.k8s_objects import WorkloadNotRenderable
from activities.cluster.kubernetes import WorkloadRejected
from activities.cluster.workload import render_workload
from contracts.cluster import WorkloadReadiness
from contracts.deployment import ApplyWorkloadInput, WaitWorkloadInput, WorkloadRef
from fleet.replica import ModelReplica


class ClusterActivities:
    def __init__(self, driver: ClusterDriver) -> None:
        self.driver = driver

    def activities(self) -> list[object]:
        return [self.apply_workload, self.delete_workload, self.wait_workload_ready]

    @activity.defn(name="apply_workload")
    async def apply_workload(self, input: ApplyWorkloadInput) -> int:
        """Render the replica's pods and claims and apply them; returns the pod count. Idempotent."""
        workload = render_workload(ModelReplica.model_validate(input.manifest))
        try:
            await asyncio.to_thread(self.driver.apply_workload, workload)
        except (WorkloadRejected, WorkloadNotRenderable) as error:  # the same request would be refused again
            raise ApplicationError(str(error), type="WorkloadRejected", non_retryable=True) from error
        return len(workload.pods)

    @activity.defn(name="delete_workload")
    async def delete_workload(self, ref: WorkloadRef) -> bool:
        return await asyncio.to_thread(self.driver.delete_workload, ref.cluster, ref.name, ref.namespace)

    @activity.defn(name="wait_workload_ready")
    async def wait_workload_ready(self, input: WaitWorkloadInput) -> WorkloadReadiness:
        deadline = time.monotonic() + input.window_seconds
        while True:
            readiness = await asyncio.to_thread(self.driver.workload_ready, input.cluster, input.name, input.namespace)
            activity.heartbeat(readiness.message)
            if readiness.ready or not readiness.exists or time.monotonic() >= deadline:
                return readiness
            await asyncio.sleep(input.poll_seconds)
