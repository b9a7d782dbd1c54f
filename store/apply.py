"""Write a validated Fleet to PostgreSQL in one transaction, changing only what differs.

Applying the same file twice changes nothing. Objects missing from the file are kept unless `prune` is set; pruning
never deletes anything that still holds an active claim, and refuses the whole apply instead, so a typo in a fleet
file cannot yank GPUs out from under running VMs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from pydantic import BaseModel
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.cluster import connection_of
from contracts.fleet_apply import Action, ApplyChange
from contracts.vocabulary import PoolShape
from fleet.fleet import Fleet
from fleet.kinds import PLACEMENT_INPUTS
from store.db import among
from store.models import (
    AllocationRow,
    Base,
    ClaimRow,
    ClusterRow,
    CohortRow,
    InferenceClassRow,
    ModelCacheRow,
    NodeRow,
    PoolRow,
    PriorityClassRow,
    RegionRow,
    SlotRow,
    TenantRow,
)
from store.node_reports import revalidate


class ApplyResult(BaseModel):
    changes: list[ApplyChange]
    unchanged: int

    def count(self, action: Action) -> int:
        return sum(1 for c in self.changes if c.action == action)

    def summary(self) -> str:
        parts = [f"{self.count(a)} {a}" for a in ("created", "updated", "deleted") if self.count(a)]
        text = ", ".join(parts) if parts else "no changes"
        text += f", {self.unchanged} unchanged"
        kept = self.count("kept")
        if kept:
            text += f"; {kept} not in the file were kept (apply with --prune to delete them)"
        carried = self.count("carried")
        if carried:
            text += f"; {carried} ModelService{'s' if carried != 1 else ''} checked and not written (routing, not inventory)"
        return text

    def changed(self) -> bool:
        """Whether the inventory changed (what was kept or only carried did not change it): any change (a quota, a
        node, a region) may admit a waiting request, so the queues are walked."""
        return any(c.action not in ("kept", "carried") for c in self.changes)

    def replans_deployments(self) -> bool:
        """Whether something a deployment's placement reads changed: running deployments then re-plan at once, not
        at their resync. The one rule for `PUT /v1/fleet` and `berth apply` alike."""
        return any(c.kind in PLACEMENT_INPUTS and c.action not in ("kept", "carried") for c in self.changes)


class ApplyRefused(Exception):
    """The apply would delete capacity that active allocations hold; nothing was written."""


# What each table is keyed by, and how an object is named in messages.
_Key = Hashable


async def _sync(
    session: AsyncSession,
    model: type[Base],
    kind: str,
    key_of: Callable[[Any], _Key],
    desired: dict[_Key, dict[str, Any]],
    name_of: Callable[[_Key], str],
    changes: list[ApplyChange],
    keep_on_update: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[int, list[Any]]:
    """Insert missing rows and update differing ones; return (unchanged count, rows not in the file)."""
    existing = {key_of(row): row for row in (await session.scalars(select(model))).all()}
    unchanged = 0
    for key, values in desired.items():
        row = existing.pop(key, None)
        if row is None:
            session.add(model(**values))
            changes.append(ApplyChange(kind=kind, name=name_of(key), action="created"))
            continue
        if keep_on_update is not None:
            values = keep_on_update(row, values)
        differing = {field: value for field, value in values.items() if getattr(row, field) != value}
        if differing:
            for field, value in differing.items():
                setattr(row, field, value)
            changes.append(ApplyChange(kind=kind, name=name_of(key), action="updated"))
        else:
            unchanged += 1
    await session.flush()
    return unchanged, list(existing.values())


def _desired(fleet: Fleet) -> dict[str, dict[_Key, dict[str, Any]]]:
    regions = {
        name: {
            "name": name,
            "status": r.spec.status.value,
            "jurisdiction": r.spec.jurisdiction,
            "prices": dict(r.spec.prices),
            "labels": dict(r.metadata.labels),
            "queueing_strategy": r.spec.queueing_strategy.value,
        }
        for name, r in fleet.regions.items()
    }
    priority_classes = {
        name: {
            "name": name,
            "value": c.spec.value,
            "is_default": c.spec.default,
            "description": c.spec.description,
            "preemptible": c.spec.preemptible,
            "grace_seconds": c.spec.grace_period,
            "never_preempts": c.spec.preemption_policy == "Never",
            "non_preemptible": c.spec.non_preemptible,
        }
        for name, c in fleet.priority_classes.items()
    }
    classes = {
        name: {
            "name": name,
            "api_version": c.api_version,
            "spec": c.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        for name, c in fleet.classes.items()
    }
    tenants = {
        name: {
            "name": name,
            "gpu_quota": t.spec.gpu_quota,
            "allowed_regions": list(t.spec.allowed_regions) if t.spec.allowed_regions is not None else None,
            "required_jurisdiction": t.spec.required_jurisdiction,
            "rate_limit": t.spec.rate_limit.model_dump(mode="json") if t.spec.rate_limit is not None else None,
            "weight": t.spec.weight,
            "priority_classes": list(t.spec.priority_classes) if t.spec.priority_classes is not None else None,
            "queue": t.spec.queue.model_dump(mode="json"),
            "cohort": t.spec.cohort,
            "borrowing_limit": t.spec.borrowing_limit,
            "lending_limit": t.spec.lending_limit,
            "quotas": [q.model_dump(mode="json") for q in t.spec.quotas] if t.spec.quotas is not None else None,
            "preemption": t.spec.preemption.model_dump(mode="json"),
        }
        for name, t in fleet.tenants.items()
    }
    cohorts = {
        name: {
            "name": name,
            "parent_name": c.spec.parent_name,
            "gpu_quota": c.spec.gpu_quota,
            "borrowing_limit": c.spec.borrowing_limit,
            "lending_limit": c.spec.lending_limit,
            "quotas": [q.model_dump(mode="json") for q in c.spec.quotas],
            "fair_sharing": c.spec.fair_sharing.enabled,
            "weight": c.spec.fair_sharing.weight,
            "usage_half_life_seconds": c.spec.fair_sharing.usage_half_life,
            "preemption_strategies": list(c.spec.fair_sharing.preemption_strategies),
            "quota_mode": c.spec.quota_mode.value,
        }
        for name, c in fleet.cohorts.items()
    }
    clusters = {
        name: {
            "name": name,
            "api_version": c.api_version,
            "region": c.spec.region,
            "labels": dict(c.metadata.labels),
            "taints": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in c.spec.taints],
            "status": c.status.model_dump(mode="json", by_alias=True, exclude_none=True) if c.status else None,
            "connection": _connection(c.spec.cluster, c.metadata.annotations),
            "annotations": dict(c.metadata.annotations),
            "deletion_timestamp": c.metadata.deletion_timestamp,
        }
        for name, c in fleet.clusters.items()
    }
    pools: dict[_Key, dict[str, Any]] = {}
    nodes: dict[_Key, dict[str, Any]] = {}
    slots: dict[_Key, dict[str, Any]] = {}
    for hosts in fleet.pools():
        cluster, pool = hosts.cluster.metadata.name, hosts.pool
        position = hosts.cluster.spec.node_pools.index(pool)
        pools[(cluster, pool.name)] = {
            "cluster": cluster,
            "name": pool.name,
            "position": position,
            "class_name": pool.class_name,
            "shape": pool.shape.value,
            "gpu_product": pool.gpu_product,
            "node_count": max(0, pool.node_count if pool.node_count is not None else len(hosts.nodes)),
            "max_node_count": pool.max_node_count if pool.shape is PoolShape.KUBERNETES else None,
            "node_template": pool.node_template.model_dump(mode="json", by_alias=True) if pool.node_template else None,
            "deadlines": pool.deadlines.seconds() or None if pool.deadlines else None,
            "max_lease_seconds": pool.max_lease,
            "on_gpu_failure": pool.on_gpu_failure.value,
        }
        for node in hosts.nodes:
            nodes[node.name] = {
                "name": node.name,
                "pool": (cluster, pool.name),
                "declared_status": node.status.value,
                "labels": dict(node.labels),
                "cpus": node.cpus,
                "memory_mib": node.memory_mib,
                "numa_nodes": node.numa_nodes,
                "simulation": node.simulation.model_dump(mode="json", by_alias=True),
            }
            for slot in node.slots:
                slots[(node.name, slot.index)] = {
                    "node_id": node.name,
                    "slot_index": slot.index,
                    "gpu_pci_address": slot.gpu_pci,
                    "fabric_parent_pci_address": slot.fabric_parent_pci,
                    "fabric_vf_pci_address": slot.fabric_vf_pci,
                    "fabric_claim_mode": slot.fabric_claim_mode.value,
                    "nvme_device": slot.nvme_device,
                    "numa_node": slot.numa_node,
                    "vcpus": slot.vcpus,
                    "memory_mib": slot.memory_mib,
                    "mac_address": slot.mac,
                    "private_ip": str(slot.private_ip) if slot.private_ip else None,
                    "approved": slot.approved,
                }
    # ModelCaches: where a deployment's modelCacheRef may place new replicas (read by the planning activity).
    caches = {
        (c.namespace, c.metadata.name): {
            "namespace": c.namespace,
            "name": c.metadata.name,
            "api_version": c.api_version,
            "spec": c.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            "status": c.status.model_dump(mode="json", by_alias=True, exclude_none=True) if c.status else None,
        }
        for c in fleet.caches.values()
    }
    return {
        "regions": regions,
        "classes": classes,
        "tenants": tenants,
        "cohorts": cohorts,
        "clusters": clusters,
        "pools": pools,
        "nodes": nodes,
        "slots": slots,
        "caches": caches,
        "priority_classes": priority_classes,
    }


def _connection(cluster: Any, annotations: dict[str, str]) -> dict[str, Any] | None:
    """The cluster's connection reference, or None: it stays simulated."""
    connection = connection_of(cluster, annotations)
    return connection.model_dump(mode="json") if connection else None


def _keep_operator_status(row: NodeRow, values: dict[str, Any]) -> dict[str, Any]:
    """A cordon set through the API survives re-applying the file, until the file itself changes the status."""
    if row.declared_status == values["declared_status"]:
        return {k: v for k, v in values.items() if k != "status"}
    return values


async def _refuse_if_claimed(session: AsyncSession, slot_ids: list[int], what: str) -> None:
    if not slot_ids:
        return
    rows = (
        await session.execute(
            select(ClaimRow.node_id, func.count(), func.array_agg(func.distinct(ClaimRow.allocation_id)))
            .where(among(ClaimRow.slot_id, slot_ids), ClaimRow.released_at.is_(None))
            .group_by(ClaimRow.node_id)
            .order_by(ClaimRow.node_id)
        )
    ).all()
    if rows:
        held = "; ".join(
            f"node {node} has {count} active claim(s) by allocation(s) {', '.join(sorted(ids))}"
            for node, count, ids in rows
        )
        raise ApplyRefused(f"refusing to prune {what}: {held}. Release those allocations first; nothing was changed.")


def refuse_non_inventory(fleet: Fleet) -> None:
    """Documents read elsewhere (plans, what-ifs, NodeLists not adopted) are refused, never silently skipped."""
    present = [
        kind
        for kind, objects in (
            ("ModelDeployment", fleet.deployments),
            ("ModelReplica", fleet.replicas),
            ("SlotState", fleet.slot_states),
            ("NodeList", fleet.node_lists),
        )
        if objects
    ]
    if present:
        raise ApplyRefused(
            f"{', '.join(present)} documents are not inventory (plan deployments with `berth plan -f`, ask what-if "
            "questions with `berth explain -f`, adopt a NodeList with `berth apply --cluster NAME`); nothing was "
            "written: remove them to apply the rest"
        )


async def apply_fleet(session: AsyncSession, fleet: Fleet, prune: bool = False) -> ApplyResult:
    """Make the database match `fleet`. The caller owns the transaction (commit on success, rollback on error)."""
    refuse_non_inventory(fleet)
    desired = _desired(fleet)
    changes: list[ApplyChange] = []
    unchanged = 0
    leftovers: dict[str, list[Any]] = {}

    async def sync(
        kind: str,
        model: type[Base],
        key_of: Callable[[Any], _Key],
        rows: dict[_Key, dict[str, Any]],
        name_of: Callable[[_Key], str] = str,
        keep: Any = None,
    ) -> None:
        nonlocal unchanged
        same, extra = await _sync(session, model, kind, key_of, rows, name_of, changes, keep)
        unchanged += same
        leftovers[kind] = extra

    await sync("Region", RegionRow, lambda r: r.name, desired["regions"])
    await sync("InferenceClass", InferenceClassRow, lambda r: r.name, desired["classes"])
    # The default class may move from one class to another in one apply: step down the old one first, so the
    # one-default index never sees two.
    defaults = [name for name, values in desired["priority_classes"].items() if values["is_default"]]
    stepped_down = set(
        (
            await session.scalars(
                update(PriorityClassRow)
                .where(PriorityClassRow.is_default, PriorityClassRow.name.not_in(defaults))
                .values(is_default=False)
                .returning(PriorityClassRow.name)
            )
        ).all()
    )
    before = len(changes)
    await sync("PriorityClass", PriorityClassRow, lambda r: r.name, desired["priority_classes"])
    # A class stepped down above reads as unchanged to sync, but this apply did change it.
    reported = {change.name for change in changes[before:]}
    for name in sorted((stepped_down & desired["priority_classes"].keys()) - reported):
        changes.append(ApplyChange(kind="PriorityClass", name=name, action="updated"))
        unchanged -= 1
    await sync("Tenant", TenantRow, lambda r: r.name, desired["tenants"])
    await sync("Cohort", CohortRow, lambda r: r.name, desired["cohorts"])
    await sync("InferenceCluster", ClusterRow, lambda r: r.name, desired["clusters"])
    await sync("NodePool", PoolRow, lambda r: (r.cluster, r.name), desired["pools"], lambda k: f"{k[0]}/{k[1]}")
    await sync(
        "ModelCache", ModelCacheRow, lambda r: (r.namespace, r.name), desired["caches"], lambda k: f"{k[0]}/{k[1]}"
    )

    pool_ids = {(p.cluster, p.name): p.id for p in (await session.scalars(select(PoolRow))).all()}
    node_rows = {}
    for name, values in desired["nodes"].items():
        values = {k: v for k, v in values.items() if k != "pool"} | {"pool_id": pool_ids[values["pool"]]}
        node_rows[name] = values | {"status": values["declared_status"]}
    await sync("Node", NodeRow, lambda r: r.name, node_rows, keep=_keep_operator_status)

    # Two slots of one host may swap fabric VFs in one apply; clear the VFs that change first so the unique index
    # never sees a transient duplicate.
    existing_slots = {(s.node_id, s.slot_index): s for s in (await session.scalars(select(SlotRow))).all()}
    for key, values in desired["slots"].items():
        row = existing_slots.get(key)
        if row is not None and row.fabric_vf_pci_address != values["fabric_vf_pci_address"]:
            row.fabric_vf_pci_address = None
    await session.flush()
    await sync("Slot", SlotRow, lambda r: (r.node_id, r.slot_index), desired["slots"], lambda k: f"{k[0]}/{k[1]}")
    await _prune(session, leftovers, changes, prune)
    # A node whose slots the operator added, changed or pruned is checked again against the host its agent last
    # reported (and its approval hash moves, so its agent learns the new slots at its next report).
    changed_nodes = [c.name.rsplit("/", 1)[0] for c in changes if c.kind == "Slot" and c.action != "kept"]
    await revalidate(session, changed_nodes)
    changes += [ApplyChange(kind="ModelService", name=name, action="carried") for name in sorted(fleet.services)]
    return ApplyResult(changes=changes, unchanged=unchanged)


async def _prune(
    session: AsyncSession, leftovers: dict[str, list[Any]], changes: list[ApplyChange], prune: bool
) -> None:
    names: dict[str, Callable[[Any], str]] = {
        "Slot": lambda r: f"{r.node_id}/{r.slot_index}",
        "Node": lambda r: r.name,
        "NodePool": lambda r: f"{r.cluster}/{r.name}",
        "ModelCache": lambda r: f"{r.namespace}/{r.name}",
    }
    order = [
        "Slot",
        "Node",
        "NodePool",
        "InferenceCluster",
        "InferenceClass",
        "Tenant",
        "Cohort",
        "Region",
        "ModelCache",
        "PriorityClass",
    ]
    if not prune:
        # Slots and nodes of objects that stay are part of those objects: report only top-level leftovers.
        for kind in order:
            for row in leftovers[kind]:
                changes.append(ApplyChange(kind=kind, name=names.get(kind, lambda r: r.name)(row), action="kept"))
        return

    # Everything that would disappear, slots of deleted nodes, pools and clusters included, must be unclaimed.
    doomed_nodes = {r.name for r in leftovers["Node"]}
    doomed_pools = {r.id for r in leftovers["NodePool"]}
    doomed_clusters = {r.name for r in leftovers["InferenceCluster"]}
    if doomed_clusters:
        doomed_pools |= set(
            (await session.scalars(select(PoolRow.id).where(among(PoolRow.cluster, doomed_clusters)))).all()
        )
    if doomed_pools:
        doomed_nodes |= set(
            (await session.scalars(select(NodeRow.name).where(among(NodeRow.pool_id, doomed_pools)))).all()
        )
    slot_ids = [r.id for r in leftovers["Slot"]]
    if doomed_nodes:
        slot_ids += list((await session.scalars(select(SlotRow.id).where(among(SlotRow.node_id, doomed_nodes)))).all())
    await _refuse_if_claimed(session, slot_ids, "capacity missing from the file")

    for tenant in leftovers["Tenant"]:
        held = await session.scalar(
            select(func.count()).select_from(AllocationRow).where(AllocationRow.tenant == tenant.name)
        )
        if held:
            raise ApplyRefused(
                f"refusing to prune tenant {tenant.name!r}: it has {held} allocation(s) on record; nothing was changed."
            )

    for kind in order:
        for row in leftovers[kind]:
            changes.append(ApplyChange(kind=kind, name=names.get(kind, lambda r: r.name)(row), action="deleted"))
            await session.delete(row)
        await session.flush()
    if doomed_nodes:
        await session.execute(delete(NodeRow).where(among(NodeRow.name, doomed_nodes)))
