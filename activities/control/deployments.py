"""Control activities of ModelDeployments: plan over the observed state, keep the deployment's row in step, and
record or release a replica's ledger rows.

Planning is one activity: read clusters, pools, classes, ModelCaches and every other deployment's replicas from
PostgreSQL,
observe each cluster's health through the cluster driver, and call the pure fleet scheduler there (never in the
workflow: it is CPU work over data the workflow must not hold). The plan comes back with the new replicas already
rendered as ModelReplica manifests.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cluster.driver import ClusterDriver
from contracts.cluster import ClusterObservation
from contracts.deployment import (
    LEDGER_CONFLICT,
    DeploymentRef,
    DeploymentStatusRecord,
    PlanDeploymentInput,
    PlannedDeployment,
    RecordReplicaInput,
    ReplicaRef,
    ReplicaStateInput,
)
from fleet.deployment import ModelDeployment
from fleet.replica import ModelReplica
from scheduler.deployment import manifest_dict, replica_manifest
from scheduler.deployment.planning import plan_deployment
from store import deployments as store
from store.db import AsyncSession, async_sessionmaker
from store.deployments import Health, LedgerOvercommit, Usage


class DeploymentActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], clusters: ClusterDriver) -> None:
        self.sessions = sessions
        self.clusters = clusters

    def activities(self) -> list[object]:
        return [
            self.plan_deployment,
            self.record_deployment_status,
            self.delete_deployment_record,
            self.record_replica,
            self.set_replica_state,
            self.release_replica,
        ]

    @activity.defn(name="plan_deployment")
    async def plan_deployment(self, input: PlanDeploymentInput) -> PlannedDeployment:
        """Save the spec, read the observed state, and run the fleet scheduler over it. No side effect beyond the
        deployment's own row, so a retry plans again from fresh state."""
        deployment = ModelDeployment.model_validate(input.deployment)
        namespace, name = deployment.namespace, deployment.metadata.name
        async with self.sessions.begin() as session:
            await store.save_deployment(session, namespace, name, input.deployment, deployment.spec.replicas)
            names = await store.cluster_names(session)
        observations = await asyncio.gather(*(asyncio.to_thread(self.clusters.observe_cluster, n) for n in names))
        health = {
            o.cluster: Health(
                o.ready, o.gateway_address, _schedulable(o), o.message, {p.name: p.excluded for p in o.pools or []}
            )
            for o in observations
        }
        async with self.sessions() as session:
            clusters = await store.load_clusters(session, health)
            classes = await store.load_classes(session)
            caches = await store.load_caches(session)
            others = await store.recorded_replicas(session, exclude_deployment=(namespace, name))
        own = [ModelReplica.model_validate(m) for m in input.own_replicas]
        # In a worker thread: the fleet scheduler evaluates the deployment's CEL selectors (each bounded only by
        # Kubernetes' per-expression cost), which must not stall the control worker's event loop and its workflows.
        evicted = {replica: why for o in observations for replica, why in o.evicted.items()}
        plan = await asyncio.to_thread(plan_deployment, deployment, clusters, classes, [*others, *own], caches, evicted)
        manifests = [manifest_dict(replica_manifest(deployment, placement)) for placement in plan.new]
        return PlannedDeployment(plan=plan, new_replicas=manifests, clusters_observed=len(names))

    @activity.defn(name="record_deployment_status")
    async def record_deployment_status(self, record: DeploymentStatusRecord) -> None:
        async with self.sessions.begin() as session:
            await store.save_status(session, record.namespace, record.name, record.status)

    @activity.defn(name="delete_deployment_record")
    async def delete_deployment_record(self, ref: DeploymentRef) -> None:
        async with self.sessions.begin() as session:
            await store.delete_deployment(session, ref.namespace, ref.name)

    @activity.defn(name="record_replica")
    async def record_replica(self, input: RecordReplicaInput) -> bool:
        """The replica's row and ledger rows in one transaction, re-checked under the pools' row locks. A pool that
        would be overcommitted is a non-retryable `LedgerConflict`: the deployment re-plans from fresh state."""
        try:
            async with self.sessions.begin() as session:
                return await store.record_replica(
                    session,
                    namespace=input.namespace,
                    deployment=input.deployment,
                    name=input.name,
                    cluster=input.cluster,
                    index=input.index,
                    manifest=input.manifest,
                    usage=[Usage(engine=u.engine, pool=u.pool, nodes=u.nodes) for u in input.usage],
                )
        except LedgerOvercommit as error:
            raise ApplicationError(str(error), type=LEDGER_CONFLICT, non_retryable=True) from error

    @activity.defn(name="set_replica_state")
    async def set_replica_state(self, input: ReplicaStateInput) -> None:
        async with self.sessions.begin() as session:
            await store.set_replica_state(session, input.namespace, input.name, input.state)

    @activity.defn(name="release_replica")
    async def release_replica(self, ref: ReplicaRef) -> bool:
        """Delete the replica's row and its ledger rows. Idempotent."""
        async with self.sessions.begin() as session:
            return await store.release_replica(session, ref.namespace, ref.name)


def _schedulable(observation: ClusterObservation) -> dict[str, int] | None:
    """Per pool, the nodes a real cluster's driver saw able to take work; None for a simulated cluster."""
    if observation.pools is None:
        return None
    return {pool.name: pool.schedulable for pool in observation.pools}
