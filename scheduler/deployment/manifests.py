"""New replicas as ModelReplica objects, in the shape the scheduler reads back, so a plan can be fed in as input.

Labels are Modelplane's (deployment, cluster, per-cluster index) on top of the template's own labels; each member
carries its pinned pool, its pod template and the requests it claims (with the DeviceClass each is claimed through),
which is what the ledger charges it by on the next pass. The object validates against Modelplane's ModelReplica XRD
(`fleet/replica.py` says how Berth's one extra, a member's multi-node span from docs/seeds.md, "Resource fit from a
memory need", travels as an annotation). The deployment's tolerations, which the XRD has no replica field for
either, travel as the `berth.dev/tolerations` annotation (a JSON list, as a pod spec writes them) so the cluster
driver puts them on the replica's pods.
"""

from __future__ import annotations

import json

from contracts.fleet_plan import ReplicaPlacement
from fleet.deployment import ModelDeployment
from fleet.meta import ObjectMeta
from fleet.replica import (
    CLUSTER_LABEL,
    DEPLOYMENT_LABEL,
    INDEX_LABEL,
    MemberGpus,
    ModelReplica,
    ModelReplicaSpec,
    ReplicaDeviceRequest,
    ReplicaEngine,
    ReplicaMember,
    ReplicaSelector,
)

DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"  # NVIDIA's DRA driver's DeviceClass, for a request whose device names none
TOLERATIONS_ANNOTATION = "berth.dev/tolerations"


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
                        device_class_name=r.device_class_name or r.device or DEFAULT_DEVICE_CLASS,
                        selectors=[ReplicaSelector(cel=s) for s in r.selectors],
                    )
                    for r in placed_member.device_requests
                ],
                template=member.template or {},
                nodes=placed_member.span,
                gpus=MemberGpus(device=placed_member.gpus.device, nodes=placed_member.gpus.nodes)
                if placed_member.gpus is not None
                else None,
            )
            for member, placed_member in zip(engine.members, placed.members, strict=True)
        ]
        engines.append(ReplicaEngine(name=engine.name, copies=engine.copies, phase=engine.phase, members=members))
    return ModelReplica(
        api_version=deployment.api_version,
        kind="ModelReplica",
        metadata=ObjectMeta(
            name=placement.name, namespace=deployment.namespace, labels=labels, annotations=_annotations(deployment)
        ),
        spec=ModelReplicaSpec(
            cluster_name=placement.cluster,
            model_cache_ref=template.spec.model_cache_ref,
            serving=template.spec.serving,
            engines=engines,
        ),
    )


def _annotations(deployment: ModelDeployment) -> dict[str, str]:
    tolerations = deployment.spec.template.spec.tolerations
    if not tolerations:
        return {}
    written = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tolerations]
    return {TOLERATIONS_ANNOTATION: json.dumps(written, separators=(",", ":"))}


def manifest_dict(replica: ModelReplica) -> dict[str, object]:
    """The object as YAML or JSON would carry it: camelCase keys, unset fields left out."""
    return replica.model_dump(mode="json", by_alias=True, exclude_none=True)
