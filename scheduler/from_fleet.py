"""Build a snapshot from a fleet file (and optional SlotState documents): the offline path, used by `berth explain
-f`, simulated node agents and tests. The online path builds the same views from PostgreSQL rows.

Only slice and bare-metal pools enter the snapshot: Kubernetes pools serve ModelDeployments and have no slots.
Slot ids are `<node>/<index>`. A cluster without an observed status counts as ready. With no agents to ask, every
slot counts as validated, and a node's agent is live unless the fleet simulates it as down (`simulation.agentDown`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from contracts.vocabulary import SlotState
from fleet.fleet import Fleet
from fleet.inference_class import ClaimKind
from fleet.node import Node
from fleet.slot_state import SlotStateDocument
from fleet.tenant import FlavorQuota, TenantPreemption
from scheduler.snapshot import Snapshot
from scheduler.views import (
    CohortView,
    FlavorQuotaView,
    NodeView,
    PoolView,
    PreemptionPolicy,
    RegionView,
    TenantView,
    slot_id,
    slot_view,
)

# slot id -> (state, allocation id, tenant)
Holds = dict[str, tuple[SlotState, str | None, str | None]]


def snapshot_from_fleet(fleet: Fleet, states: Iterable[SlotStateDocument] = ()) -> Snapshot:
    """Raises ValueError naming the first slot a SlotState document gets wrong (unknown, or listed twice)."""
    holds = _holds(states)
    active: Counter[str] = Counter()
    in_flight: Counter[str] = Counter()
    pools: list[PoolView] = []
    nodes: list[NodeView] = []
    for hosts in fleet.host_pools():
        cluster, pool = hosts.cluster, hosts.pool
        inference_class = fleet.classes.get(pool.class_name)
        devices = inference_class.spec.devices if inference_class is not None else []
        pools.append(
            PoolView(
                cluster=cluster.metadata.name,
                name=pool.name,
                region=cluster.spec.region or "",
                shape=pool.shape,
                gpu_product=pool.gpu_product,
                nodes=tuple(node.name for node in hosts.nodes),
                devices=tuple(device.as_cel_device() for device in devices if device.claim is ClaimKind.DRA),
                cluster_labels=dict(cluster.metadata.labels),
                cluster_ready=cluster.status is None or cluster.status.ready,
                deadlines=pool.deadlines.seconds() if pool.deadlines else {},
                max_lease_seconds=pool.max_lease,
            )
        )
        nodes.extend(node_view(node, holds) for node in hosts.nodes)

    known = {slot.id for node in nodes for slot in node.slots}
    place = {node: (pool.gpu_product, pool.region) for pool in pools if pool.gpu_product for node in pool.nodes}
    held: Counter[tuple[str, str, str]] = Counter()  # (tenant, product, region) -> GPUs
    for slot, (state, _, tenant) in holds.items():
        if slot not in known:
            raise ValueError(f"SlotState: slot {slot!r} is not in the fleet (slot ids are <node>/<index>)")
        if tenant is not None:
            (active if state is SlotState.CLAIMED else in_flight)[tenant] += 1
            product, region = place.get(str(slot).rpartition("/")[0], (None, None))
            if product is not None and region is not None:
                held[(tenant, product, region)] += 1

    tenants = [
        TenantView(
            name=name,
            gpu_quota=tenant.spec.gpu_quota,
            allowed_regions=frozenset(tenant.spec.allowed_regions) if tenant.spec.allowed_regions is not None else None,
            required_jurisdiction=tenant.spec.required_jurisdiction,
            active_gpus=active[name],
            in_flight_gpus=in_flight[name],
            weight=tenant.spec.weight,
            cohort=tenant.spec.cohort,
            borrowing_limit=tenant.spec.borrowing_limit,
            lending_limit=tenant.spec.lending_limit,
            quotas=_flavor_views(tenant.spec.quotas) if tenant.spec.quotas is not None else None,
            held=tuple((product, region, gpus) for (who, product, region), gpus in sorted(held.items()) if who == name),
            preemption=preemption_policy(tenant.spec.preemption),
        )
        for name, tenant in fleet.tenants.items()
    ]
    regions = [
        RegionView(
            name=name,
            status=region.spec.status,
            jurisdiction=region.spec.jurisdiction,
            prices=dict(region.spec.prices),
            queueing_strategy=region.spec.queueing_strategy,
        )
        for name, region in fleet.regions.items()
    ]
    cohorts = [
        CohortView(
            name=name,
            parent=cohort.spec.parent_name,
            gpu_quota=cohort.spec.gpu_quota,
            borrowing_limit=cohort.spec.borrowing_limit,
            lending_limit=cohort.spec.lending_limit,
            quotas=_flavor_views(cohort.spec.quotas),
            fair_sharing=cohort.spec.fair_sharing.enabled,
            weight=cohort.spec.fair_sharing.weight,
            usage_half_life=cohort.spec.fair_sharing.usage_half_life,
            preemption_strategies=cohort.spec.fair_sharing.preemption_strategies,
            quota_mode=cohort.spec.quota_mode,
        )
        for name, cohort in fleet.cohorts.items()
    ]
    return Snapshot(regions=regions, pools=pools, nodes=nodes, tenants=tenants, cohorts=cohorts)


def _flavor_views(quotas: Iterable[FlavorQuota]) -> tuple[FlavorQuotaView, ...]:
    """A tenant's or a cohort's `quotas` (per GPU product and region) as the scheduler sees them."""
    return tuple(FlavorQuotaView(q.product, q.region, q.nominal, q.borrowing_limit, q.lending_limit) for q in quotas)


def _holds(documents: Iterable[SlotStateDocument]) -> Holds:
    holds: Holds = {}
    entries = [
        (slot, (SlotState(hold.state), hold.id, hold.tenant))
        for document in documents
        for hold in document.spec.allocations
        for slot in hold.slots
    ] + [(slot, (SlotState.QUARANTINED, None, None)) for document in documents for slot in document.spec.quarantined]
    for slot, hold in entries:
        if slot in holds:
            raise ValueError(f"SlotState: slot {slot!r} is listed twice")
        holds[slot] = hold
    return holds


def node_view(node: Node, holds: Holds | None = None) -> NodeView:
    """A fleet host as the scheduler sees it; slots not in `holds` are free."""
    holds = holds or {}
    slots = []
    for slot in node.slots:
        state, holder, _ = holds.get(slot_id(node.name, slot.index), (SlotState.FREE, None, None))
        slots.append(slot_view(node.name, slot, state=state, holder=holder))
    return NodeView(
        name=node.name,
        status=node.status,
        slots=tuple(slots),
        labels=dict(node.labels),
        numa_nodes=node.numa_nodes,
        agent_live=not node.simulation.agent_down,
    )


def preemption_policy(spec: TenantPreemption) -> PreemptionPolicy:
    """A tenant's `preemption` (fleet file, or `tenants.preemption` read back) as the scheduler weighs it."""
    borrow = spec.borrow_within_cohort
    return PreemptionPolicy(
        spec.within_tenant, spec.reclaim_within_cohort, borrow.policy, borrow.max_priority_threshold
    )
