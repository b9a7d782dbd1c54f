"""New replicas as ModelReplica objects, in the shape the scheduler reads back, so a plan can be fed in as input.

Labels are Modelplane's (deployment, cluster, per-cluster index) on top of the template's own labels; each member
carries its pinned pool and the requests it claims, which is what the ledger charges it by on the next pass.
"""

from __future__ import annotations

from fleet.deployment import ModelDeployment
from fleet.meta import ObjectMeta
from fleet.replica import (
    CLUSTER_LABEL,
    DEPLOYMENT_LABEL,
    INDEX_LABEL,
    ModelReplica,
    ModelReplicaSpec,
    ReplicaDeviceRequest,
    ReplicaEngine,
    ReplicaMember,
    ReplicaSelector,
)
from scheduler.fleet.results import ReplicaPlacement


def replica_manifest(deployment: ModelDeployment, placement: ReplicaPlacement) -> ModelReplica:
    template = deployment.spec.template
    labels = dict(template.metadata.labels) if template.metadata else {}
    labels.update(
        {
            DEPLOYMENT_LABEL: deployment.metadata.name,
            CLUSTER_LABEL: placement.cluster,
            INDEX_LABEL: str(placement.index),
        }
    )
    engines_by_name = {engine.name: engine for engine in template.spec.engines}
    engines = []
    for placed in placement.engines:
        engine = engines_by_name[placed.name]
        members = [
            ReplicaMember(
                role=member.role,
                worker=member.worker,
                node_pool_name=placed_member.pool,
                device_requests=[
                    ReplicaDeviceRequest(
                        name=r.name,
                        count=r.count,
                        device=r.device,
                        selectors=[ReplicaSelector(cel=s) for s in r.selectors],
                    )
                    for r in placed_member.device_requests
                ],
                nodes=placed_member.span,
            )
            for member, placed_member in zip(engine.members, placed.members, strict=True)
        ]
        engines.append(ReplicaEngine(name=engine.name, copies=engine.copies, members=members))
    return ModelReplica(
        api_version=deployment.api_version,
        kind="ModelReplica",
        metadata=ObjectMeta(name=placement.name, labels=labels),
        spec=ModelReplicaSpec(cluster_name=placement.cluster, engines=engines),
    )


def manifest_dict(replica: ModelReplica) -> dict[str, object]:
    """The object as YAML or JSON would carry it: camelCase keys, unset fields left out."""
    return replica.model_dump(mode="json", by_alias=True, exclude_none=True)
