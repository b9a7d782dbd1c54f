"""ModelDeployments in PostgreSQL: the observed inventory the fleet scheduler reads, the deployment's row, and the
node-cost ledger (`model_replicas` + `replica_pool_usage`) that must never overcommit a pool.

The fleet scheduler plans over a picture that may be stale by the time a replica is recorded (another deployment
may have placed a replica meanwhile). `record_replica` is the last word: in one transaction it locks the rows of the
pools the replica charges, re-counts what every recorded replica already holds there, and refuses with
`LedgerOvercommit` rather than write a ledger that exceeds a pool's published nodes.

Deployments are namespaced as Modelplane's are: a deployment, its replicas and their ledger rows are keyed by
(namespace, name), so the same name in two namespaces is two deployments whose replicas may share a name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from fleet.cache import cache_key
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.model_cache import ModelCache
from fleet.replica import ModelReplica, ready_status
from scheduler.deployment.ledger import build_ledger, overcommitted
from scheduler.deployment.pools import Pool
from store.models import (
    ClusterRow,
    InferenceClassRow,
    ModelCacheRow,
    ModelDeploymentRow,
    ModelReplicaRow,
    PoolRow,
    ReplicaPoolUsageRow,
)


class LedgerOvercommit(Exception):
    """Recording the replica would charge a pool more nodes than it publishes."""


@dataclass(frozen=True)
class Health:
    """A cluster's observed health, from its driver."""

    ready: bool
    gateway_address: str | None
    pools: dict[str, int] | None = None  # a real cluster: per pool, the nodes that can take work now
    message: str = ""  # the driver's reason, e.g. why the cluster cannot be reached (never a credential)
    excluded: dict[str, list[str]] = field(default_factory=dict)  # per pool, `<node>: <why>` of nodes not counted


@dataclass(frozen=True)
class Usage:
    engine: str
    pool: str
    nodes: int


async def cluster_names(session: AsyncSession) -> list[str]:
    return list((await session.scalars(select(ClusterRow.name).order_by(ClusterRow.name))).all())


async def load_clusters(session: AsyncSession, health: dict[str, Health]) -> list[InferenceCluster]:
    """Every cluster as the fleet scheduler reads it: labels, annotations and deletionTimestamp (draining), taints,
    pools in published order, and a status whose
    Ready condition and gateway come from the driver's observation (published pool counts from the fleet file's
    status, when it gave one; an autoscaling pool's maxNodeCount, which the planner counts as Modelplane does)."""
    pools: dict[str, list[PoolRow]] = {}
    for pool in (await session.scalars(select(PoolRow).order_by(PoolRow.cluster, PoolRow.position))).all():
        pools.setdefault(pool.cluster, []).append(pool)
    clusters = []
    for row in (await session.scalars(select(ClusterRow).order_by(ClusterRow.name))).all():
        observed = health.get(row.name, Health(ready=False, gateway_address=None))
        status: dict[str, Any] = dict(row.status or {})
        ready: dict[str, str] = {"type": "Ready", "status": "True" if observed.ready else "False"}
        if observed.message:
            ready["message"] = observed.message
        status["conditions"] = [ready]
        status["gateway"] = {"address": observed.gateway_address}
        if observed.pools is not None:  # observed on the cluster: what its nodes can take now, not what the file says
            published = {p.get("name"): p for p in status.get("gpuPools") or []}
            status["gpuPools"] = [
                {
                    **published.get(p.name, {}),
                    "name": p.name,
                    "nodes": observed.pools.get(p.name, 0),
                    **({"excluded": observed.excluded[p.name]} if observed.excluded.get(p.name) else {}),
                }
                for p in pools.get(row.name, [])
                if p.shape == "kubernetes"
            ]
        node_pools = [
            {
                "name": p.name,
                "className": p.class_name,
                "nodeCount": p.node_count,
                **({"maxNodeCount": p.max_node_count} if p.max_node_count is not None else {}),
                "shape": p.shape,
                **({"gpuProduct": p.gpu_product} if p.gpu_product else {}),
            }
            for p in pools.get(row.name, [])
        ]
        clusters.append(
            InferenceCluster.model_validate(
                {
                    "apiVersion": row.api_version,
                    "kind": "InferenceCluster",
                    "metadata": {
                        "name": row.name,
                        "labels": row.labels,
                        "annotations": row.annotations,
                        "deletionTimestamp": row.deletion_timestamp,
                    },
                    "spec": {"region": row.region, "taints": row.taints, "nodePools": node_pools},
                    "status": status,
                }
            )
        )
    return clusters


async def load_classes(session: AsyncSession) -> dict[str, InferenceClass]:
    rows = (await session.scalars(select(InferenceClassRow))).all()
    return {
        row.name: InferenceClass.model_validate(
            {"apiVersion": row.api_version, "kind": "InferenceClass", "metadata": {"name": row.name}, "spec": row.spec}
        )
        for row in rows
    }


async def load_caches(session: AsyncSession) -> dict[str, ModelCache]:
    """Every applied ModelCache, keyed as the fleet keys them (`fleet.cache.cache_key`)."""
    caches = {}
    for row in (await session.scalars(select(ModelCacheRow))).all():
        cache = ModelCache.model_validate(
            {
                "apiVersion": row.api_version,
                "kind": "ModelCache",
                "metadata": {"name": row.name, "namespace": row.namespace},
                "spec": row.spec,
                **({"status": row.status} if row.status is not None else {}),
            }
        )
        caches[cache_key(row.namespace, row.name)] = cache
    return caches


async def recorded_replicas(
    session: AsyncSession, exclude_deployment: tuple[str, str] | None = None
) -> list[ModelReplica]:
    """Every recorded replica (but those of the excluded (namespace, name) deployment): capacity they hold, with its
    readiness as its replica workflow last recorded it (Ready True once ready; a replica in error is removed by its
    workflow, so none is recorded as one)."""
    query = select(ModelReplicaRow.spec, ModelReplicaRow.state)
    if exclude_deployment is not None:
        namespace, name = exclude_deployment
        query = query.where(~((ModelReplicaRow.namespace == namespace) & (ModelReplicaRow.deployment == name)))
    return [
        ModelReplica.model_validate({**spec, "status": ready_status(state == "ready")})
        for spec, state in (await session.execute(query)).all()
    ]


async def save_deployment(
    session: AsyncSession, namespace: str, name: str, spec: dict[str, Any], replicas: int
) -> None:
    await session.execute(
        insert(ModelDeploymentRow)
        .values(namespace=namespace, name=name, spec=spec, replicas=replicas, status={})
        .on_conflict_do_update(
            index_elements=[ModelDeploymentRow.namespace, ModelDeploymentRow.name],
            set_={"spec": spec, "replicas": replicas, "updated_at": func.now()},
        )
    )


async def load_deployment(session: AsyncSession, namespace: str, name: str) -> ModelDeploymentRow | None:
    """The deployment's row (its spec, desired replicas and last recorded status); None if it has none."""
    return await session.get(ModelDeploymentRow, (namespace, name))


async def deployment_page(
    session: AsyncSession, *, namespace: str | None = None, after: tuple[str, str] | None = None, limit: int
) -> list[ModelDeploymentRow]:
    """Up to `limit` deployments' rows (of one namespace, when given) by namespace and name, after the position
    `after` (a keyset page on the primary key)."""
    query = select(ModelDeploymentRow).order_by(ModelDeploymentRow.namespace, ModelDeploymentRow.name)
    if namespace is not None:
        query = query.where(ModelDeploymentRow.namespace == namespace)
    if after is not None:
        query = query.where(tuple_(ModelDeploymentRow.namespace, ModelDeploymentRow.name) > after)
    return list((await session.scalars(query.limit(limit))).all())


def _deployment(namespace: str, name: str) -> Any:
    return (ModelDeploymentRow.namespace == namespace) & (ModelDeploymentRow.name == name)


def _replica(namespace: str, name: str) -> Any:
    return (ModelReplicaRow.namespace == namespace) & (ModelReplicaRow.name == name)


async def save_status(session: AsyncSession, namespace: str, name: str, status: dict[str, Any]) -> None:
    await session.execute(
        update(ModelDeploymentRow).where(_deployment(namespace, name)).values(status=status, updated_at=func.now())
    )


async def delete_deployment(session: AsyncSession, namespace: str, name: str) -> None:
    """The deployment's row and, by cascade, any replica rows and ledger rows still left."""
    await session.execute(delete(ModelDeploymentRow).where(_deployment(namespace, name)))


def _published_nodes(pool: PoolRow, cluster_status: dict[str, Any] | None) -> int:
    """What the scheduler counts as the pool's nodes: the status's published count when it lists pools, else the
    Kubernetes pool's maxNodeCount when it autoscales, or its nodeCount (slice and bare-metal pools serve no
    replicas). The same count `scheduler.deployment.planning` plans with, so the ledger never refuses what the plan placed."""
    published = (cluster_status or {}).get("gpuPools") or []
    if published:
        entry = next((p for p in published if p.get("name") == pool.name), None)
        return max(int(entry.get("nodes") or 0), 0) if entry else 0
    if pool.shape != "kubernetes":
        return 0
    return pool.max_node_count if pool.max_node_count is not None else pool.node_count


async def record_replica(
    session: AsyncSession,
    *,
    namespace: str,
    deployment: str,
    name: str,
    cluster: str,
    index: int,
    manifest: dict[str, Any],
    usage: list[Usage],
) -> bool:
    """Write the replica's row and its ledger rows, unless it is recorded already (then change nothing and return
    False). Raises `LedgerOvercommit` when a pool would be charged beyond its nodes. Run inside a transaction."""
    existing = await session.get(ModelReplicaRow, (namespace, name))
    if existing is not None:
        if existing.deployment != deployment:
            raise LedgerOvercommit(f"replica name {name} is taken by deployment {existing.deployment}")
        return False
    wanted: dict[str, int] = {}
    for item in usage:
        wanted[item.pool] = wanted.get(item.pool, 0) + item.nodes
    # Lock the pools in id order (no deadlock between two recorders), then re-count under the lock.
    pools = (
        await session.scalars(
            select(PoolRow)
            .where(PoolRow.cluster == cluster, PoolRow.name.in_(sorted(wanted)))
            .order_by(PoolRow.id)
            .with_for_update()
        )
    ).all()
    by_name = {pool.name: pool for pool in pools}
    missing = sorted(set(wanted) - set(by_name))
    if missing:
        raise LedgerOvercommit(f"pool {cluster}/{missing[0]} no longer exists")
    cluster_row = await session.get(ClusterRow, cluster)
    held = dict(
        (
            await session.execute(
                select(ReplicaPoolUsageRow.pool_id, func.sum(ReplicaPoolUsageRow.nodes))
                .where(ReplicaPoolUsageRow.pool_id.in_([p.id for p in pools]))
                .group_by(ReplicaPoolUsageRow.pool_id)
            )
        ).all()
    )
    for pool_name, nodes in sorted(wanted.items()):
        pool = by_name[pool_name]
        capacity = _published_nodes(pool, cluster_row.status if cluster_row else None)
        taken = int(held.get(pool.id) or 0)
        if taken + nodes > capacity:
            raise LedgerOvercommit(
                f"pool {cluster}/{pool_name} has {capacity - taken} free node(s) of {capacity}; "
                f"replica {name} needs {nodes}"
            )
    await _check_shared_nodes(session, cluster, pools, cluster_row, manifest)
    session.add(
        ModelReplicaRow(
            namespace=namespace,
            name=name,
            deployment=deployment,
            cluster=cluster,
            replica_index=index,
            spec=manifest,
            state="recorded",
        )
    )
    await session.flush()
    for item in usage:
        session.add(
            ReplicaPoolUsageRow(
                namespace=namespace, replica=name, engine=item.engine, pool_id=by_name[item.pool].id, nodes=item.nodes
            )
        )
    await session.flush()
    return True


async def _check_shared_nodes(
    session: AsyncSession,
    cluster: str,
    pools: Sequence[PoolRow],
    cluster_row: ClusterRow | None,
    manifest: dict[str, Any],
) -> None:
    """The GPU-level half of the re-check (fitGranularity Gpu; docs/seeds.md, "GPU-level fit"): the usage rows count
    whole nodes only, so the pools' ledger is rebuilt from every replica recorded on the cluster plus this one, which
    is what the plan did, and refused when a node would give out more GPUs than it has or more nodes would be taken
    than published. Runs under the pools' row locks, like the node count."""
    rows = (await session.scalars(select(ModelReplicaRow.spec).where(ModelReplicaRow.cluster == cluster))).all()
    replicas = [ModelReplica.model_validate(spec) for spec in (*rows, manifest)]
    if not any(m.gpus is not None for r in replicas for e in r.spec.engines for m in e.members):
        return
    ledger = build_ledger("", (), replicas)
    classes = await load_classes(session)
    for pool in pools:
        capacity = _published_nodes(pool, cluster_row.status if cluster_row else None)
        devices = classes[pool.class_name].spec.devices if pool.class_name in classes else []
        problem = overcommitted(
            ledger, Pool(cluster, pool.name, pool.class_name, capacity), {d.name: d.count for d in devices}
        )
        if problem is not None:
            raise LedgerOvercommit(problem)


async def set_replica_state(session: AsyncSession, namespace: str, name: str, state: str) -> None:
    await session.execute(update(ModelReplicaRow).where(_replica(namespace, name)).values(state=state))


async def release_replica(session: AsyncSession, namespace: str, name: str) -> bool:
    """Delete the replica's row and (by cascade) its ledger rows; True if there was one."""
    result = await session.execute(delete(ModelReplicaRow).where(_replica(namespace, name)))
    return bool(result.rowcount)
