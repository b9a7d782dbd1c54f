"""Checks that need more than one document: references between objects and uniqueness across the fleet.

Per-document checks (types, formats, required fields) live on the models; these are the ones a single model cannot
see: a pool naming a class that does not exist, two hosts with one name, two slots sharing a fabric VF.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from contracts.manifest import DEFAULT_NAMESPACE
from fleet.cohort import Cohort
from fleet.deployment import ModelDeployment
from fleet.errors import FleetProblem
from fleet.fleet import Fleet
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.meta import ObjectMeta
from fleet.model_cache import ModelCache
from fleet.model_service import ModelService
from fleet.node import Node
from fleet.priority_class import PriorityClass
from fleet.region import Region
from fleet.replica import ModelReplica
from fleet.slot_state import SlotStateDocument
from fleet.template import expand_template
from fleet.tenant import Tenant

_COLLECTIONS: dict[type[BaseModel], str] = {
    Region: "regions",
    Tenant: "tenants",
    Cohort: "cohorts",
    PriorityClass: "priority_classes",
    InferenceClass: "classes",
    InferenceCluster: "clusters",
    ModelDeployment: "deployments",
    ModelReplica: "replicas",
    ModelCache: "caches",
    ModelService: "services",
    SlotStateDocument: "slot_states",
}


NAMESPACED = (ModelDeployment, ModelReplica, ModelCache, ModelService)


def object_key(obj: BaseModel) -> str:
    """How the fleet indexes an object: its name, or `<namespace>/<name>` for a namespaced kind outside the
    "default" namespace (the same name in two namespaces is two objects)."""
    metadata: ObjectMeta = obj.metadata  # type: ignore[attr-defined]
    if isinstance(obj, NAMESPACED) and metadata.namespace_or_default != DEFAULT_NAMESPACE:
        return f"{metadata.namespace}/{metadata.name}"
    return metadata.name


def _check_node(node: Node, where: FleetProblem, path: str) -> list[FleetProblem]:
    problems = []
    seen: dict[str, dict[object, int]] = {
        "index": {},
        "gpuPci": {},
        "fabricVfPci": {},
        "mac": {},
        "nvmeDevice": {},
    }
    for position, slot in enumerate(node.slots):
        for field, value in (
            ("index", slot.index),
            ("gpuPci", slot.gpu_pci),
            ("fabricVfPci", slot.fabric_vf_pci),
            ("mac", slot.mac),
            ("nvmeDevice", slot.nvme_device),
        ):
            if value is None:
                continue
            first = seen[field].setdefault(value, position)
            if first != position:
                problems.append(
                    where.model_copy(
                        update={
                            "path": f"{path}.slots[{position}].{field}",
                            "message": f"{value!r} is already used by slots[{first}] of node {node.name}",
                        }
                    )
                )
        if slot.numa_node >= node.numa_nodes:
            problems.append(
                where.model_copy(
                    update={
                        "path": f"{path}.slots[{position}].numaNode",
                        "message": f"NUMA node {slot.numa_node} does not exist on node {node.name} "
                        f"(it has numaNodes: {node.numa_nodes})",
                    }
                )
            )
    return problems


def _check_cluster(
    cluster: InferenceCluster, where: FleetProblem, fleet: Fleet, node_owner: dict[str, str]
) -> list[FleetProblem]:
    problems = []
    if cluster.spec.region is not None and cluster.spec.region not in fleet.regions:
        problems.append(
            where.model_copy(
                update={"path": "spec.region", "message": f"region {cluster.spec.region!r} is not defined"}
            )
        )
    pool_names: set[str] = set()
    for p, pool in enumerate(cluster.spec.node_pools):
        pool_path = f"spec.nodePools[{p}]"
        if pool.name in pool_names:
            problems.append(
                where.model_copy(update={"path": f"{pool_path}.name", "message": f"pool {pool.name!r} appears twice"})
            )
        pool_names.add(pool.name)
        if pool.class_name not in fleet.classes:
            problems.append(
                where.model_copy(
                    update={
                        "path": f"{pool_path}.className",
                        "message": f"InferenceClass {pool.class_name!r} is not defined in the fleet",
                    }
                )
            )
        hosts = [(f"{pool_path}.nodes[{n}]", node) for n, node in enumerate(pool.nodes)]
        if pool.node_template is not None:
            hosts += [(f"{pool_path}.nodeTemplate", node) for node in expand_template(pool.node_template)]
        for path, node in hosts:
            owner = f"{cluster.metadata.name}/{pool.name}"
            if node.name in node_owner:
                problems.append(
                    where.model_copy(
                        update={
                            "path": path,
                            "message": f"node {node.name!r} is already defined in pool {node_owner[node.name]}",
                        }
                    )
                )
                continue
            node_owner[node.name] = owner
            problems.extend(_check_node(node, where, path))
    return problems


def _check_cohort(cohort: Cohort, where: FleetProblem, fleet: Fleet) -> list[FleetProblem]:
    """Its parent exists, and climbing parents never comes back to it (Kueue refuses both)."""
    parent = cohort.spec.parent_name
    if parent is None:
        return []
    if parent not in fleet.cohorts:
        message = f"Cohort {parent!r} is not defined (a parent must be a Cohort object)"
        return [where.model_copy(update={"path": "spec.parentName", "message": message})]
    path = [cohort.metadata.name]
    while parent is not None and parent in fleet.cohorts:
        if parent in path:
            cycle = " -> ".join([*path[path.index(parent) :], parent])
            message = f"parents form a cycle: {cycle}"
            return [where.model_copy(update={"path": "spec.parentName", "message": message})]
        path.append(parent)
        parent = fleet.cohorts[parent].spec.parent_name
    return []


def check_fleet(objects: Iterable[tuple[FleetProblem, BaseModel]]) -> tuple[Fleet, list[FleetProblem]]:
    """Index validated objects into a Fleet and report cross-object problems."""
    fleet = Fleet()
    problems: list[FleetProblem] = []
    placed: list[tuple[FleetProblem, BaseModel]] = []
    for where, obj in objects:
        collection: dict[str, BaseModel] = getattr(fleet, _COLLECTIONS[type(obj)])
        name = object_key(obj)
        if name in collection:
            problems.append(
                where.model_copy(update={"path": "metadata.name", "message": f"{where.kind} {name!r} is defined twice"})
            )
            continue
        collection[name] = obj
        placed.append((where, obj))

    node_owner: dict[str, str] = {}
    for where, obj in placed:
        if isinstance(obj, InferenceCluster):
            problems.extend(_check_cluster(obj, where, fleet, node_owner))
        elif isinstance(obj, Tenant):
            for i, region in enumerate(obj.spec.allowed_regions or []):
                if region not in fleet.regions:
                    problems.append(
                        where.model_copy(
                            update={
                                "path": f"spec.allowedRegions[{i}]",
                                "message": f"region {region!r} is not defined",
                            }
                        )
                    )
            for i, flavor in enumerate(obj.spec.quotas or []):
                if flavor.region is not None and flavor.region not in fleet.regions:
                    message = f"region {flavor.region!r} is not defined"
                    problems.append(where.model_copy(update={"path": f"spec.quotas[{i}].region", "message": message}))
            for i, name in enumerate(obj.spec.priority_classes or []):
                if name not in fleet.priority_classes:
                    message = f"PriorityClass {name!r} is not defined"
                    problems.append(where.model_copy(update={"path": f"spec.priorityClasses[{i}]", "message": message}))
        elif isinstance(obj, Cohort):
            problems.extend(_check_cohort(obj, where, fleet))
    defaults = [(where, obj) for where, obj in placed if isinstance(obj, PriorityClass) and obj.spec.default]
    for where, _ in defaults[1:]:
        message = f"PriorityClass {defaults[0][1].metadata.name!r} is already the default; only one class may be"
        problems.append(where.model_copy(update={"path": "spec.default", "message": message}))
    return fleet, problems
