"""Build the scheduler's inventory snapshot from PostgreSQL: the online twin of `scheduler.from_fleet`.

A handful of plain SELECTs (no ORM objects: 10,000 nodes means 80,000 slot rows), turned into the scheduler's
frozen views. Slot ids are `<node>/<index>`, the same on every path, so node agents, claims and explanations agree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from sys import intern
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Row,
    Select,
    String,
    and_,
    bindparam,
    exists,
    func,
    literal,
    or_,
    select,
    text,
    tuple_,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.vocabulary import CohortQuotaMode, FairSharingStrategy, NodeStatus, PoolShape, SlotState
from fleet.inference_cluster import ClusterStatus
from fleet.node import FabricClaimMode
from fleet.region import QueueingStrategy, RegionStatus
from fleet.tenant import TenantPreemption
from scheduler.breaker import BreakerPolicy, Cooling, cooling_nodes
from scheduler.from_fleet import preemption_policy
from scheduler.host.checks import ValidationState
from scheduler.host.health import HealthState
from scheduler.placement.pending import with_pending_plans
from scheduler.snapshot import Snapshot
from scheduler.views import CohortView, FlavorQuotaView, NodeView, PoolView, RegionView, SlotView, TenantView, slot_id
from store.db import among
from store.liveness import Liveness, load_liveness
from store.models import (
    AllocationRow,
    ClaimRow,
    ClusterRow,
    CohortRow,
    InferenceClassRow,
    InventoryVersionRow,
    NodeAgentRow,
    NodeRow,
    PoolRow,
    QueueEntryRow,
    RegionRow,
    SlotRow,
    TenantRow,
)

IN_FLIGHT_STATES = ("pending", "placing", "planning", "claiming", "provisioning", "waiting_ready")
HELD_STATES = ("active", "preempting", "degraded")  # placed and running (a preempted one until its grace period ends)
PLANNING_STATES = ("planning", "claiming")  # a node lease may exist that no claim records yet
# Failed attempts that say nothing about the node: an operator abandoned it, another allocation won the slots, or
# the tenant's quota ran out. The breaker does not count them.
NOT_THE_NODES_FAULT = ("operator_retry", "claim_conflict", "quota_exceeded")


@dataclass(frozen=True)
class TenantUsage:
    """What a tenant holds: GPUs active (and releasing with claims) and in flight, and of those placed on a node,
    how many of which product in which region (for per-product quotas)."""

    active: int = 0
    in_flight: int = 0
    held: tuple[tuple[str, str, int], ...] = ()  # (product, region, GPUs)


NO_USAGE = TenantUsage()


def tenant_view(row: TenantRow, usage: TenantUsage = NO_USAGE) -> TenantView:
    """A tenant's policy as the scheduler sees it, with what it holds."""
    return TenantView(
        name=row.name,
        gpu_quota=row.gpu_quota,
        allowed_regions=frozenset(row.allowed_regions) if row.allowed_regions is not None else None,
        required_jurisdiction=row.required_jurisdiction,
        active_gpus=usage.active,
        in_flight_gpus=usage.in_flight,
        weight=row.weight,
        cohort=row.cohort,
        borrowing_limit=row.borrowing_limit,
        lending_limit=row.lending_limit,
        quotas=flavor_quotas(row.quotas),
        held=usage.held,
        preemption=preemption_policy(TenantPreemption.model_validate(row.preemption or {})),
    )


def cohort_view(row: CohortRow) -> CohortView:
    """A Cohort object as the scheduler sees it (scheduler/quota/cohorts.py)."""
    return CohortView(
        name=row.name,
        parent=row.parent_name,
        gpu_quota=row.gpu_quota,
        borrowing_limit=row.borrowing_limit,
        lending_limit=row.lending_limit,
        quotas=flavor_quotas(row.quotas) or (),
        fair_sharing=row.fair_sharing,
        weight=row.weight,
        usage_half_life=row.usage_half_life_seconds,
        preemption_strategies=tuple(FairSharingStrategy(s) for s in row.preemption_strategies),
        quota_mode=CohortQuotaMode(row.quota_mode),
    )


def flavor_quotas(rows: list[dict[str, Any]] | None) -> tuple[FlavorQuotaView, ...] | None:
    """`tenants.quotas` (the fleet file's `quotas`, as `store.apply` writes them) as the scheduler sees them."""
    if rows is None:
        return None
    return tuple(
        FlavorQuotaView(
            product=q["product"],
            region=q.get("region"),
            nominal=q["nominal"],
            borrowing_limit=q.get("borrowing_limit"),
            lending_limit=q.get("lending_limit"),
        )
        for q in rows
    )


def holds_gpus() -> ColumnElement[bool]:
    """An allocation counts against its tenant's quota while it is being placed, active, or releasing with claims
    still held: the moment its release frees the slots, the queue's admission pass (run in that step) and every
    decision after it see the GPUs back."""
    still_claimed = exists().where(ClaimRow.allocation_id == AllocationRow.id, ClaimRow.released_at.is_(None))
    return or_(
        AllocationRow.state.in_((*IN_FLIGHT_STATES, *HELD_STATES)),
        and_(AllocationRow.state == "releasing", still_claimed),
    )


@functools.cache
def _usage_query(of_tenants: bool) -> Select[Any]:
    """GPUs per tenant, state, and the product and region of the nodes they are placed on (none yet: NULL); a
    queued request a pass set a node aside for counts as in flight, once: by its entry (with the node's product and
    region), not also by its row, which says `placing` from the moment it was woken until its placement takes the
    entry out of the queue. Parameters `exclude` (an allocation not to count) and, `of_tenants`, `tenants`.

    Built once per shape: every claim reads it, and building the expression cost more than running it."""
    exclude = bindparam("exclude", type_=String)
    holding = (
        select(
            AllocationRow.tenant.label("tenant"),
            AllocationRow.state.label("state"),
            AllocationRow.node_id.label("node"),
            AllocationRow.gpu_count.label("gpus"),
        )
        .where(holds_gpus())
        .where(AllocationRow.id != exclude)
        .where(~exists().where(QueueEntryRow.allocation_id == AllocationRow.id, QueueEntryRow.node.is_not(None)))
    )
    admitted = select(QueueEntryRow.tenant, literal("placing"), QueueEntryRow.node, QueueEntryRow.gpu_count).where(
        QueueEntryRow.node.is_not(None), QueueEntryRow.allocation_id != exclude
    )
    if of_tenants:
        holding = holding.where(AllocationRow.tenant.in_(bindparam("tenants", expanding=True)))
        admitted = admitted.where(QueueEntryRow.tenant.in_(bindparam("tenants", expanding=True)))
    usage = union_all(holding, admitted).subquery()
    return (
        select(usage.c.tenant, usage.c.state, PoolRow.gpu_product, ClusterRow.region, func.sum(usage.c.gpus))
        .outerjoin(NodeRow, NodeRow.name == usage.c.node)
        .outerjoin(PoolRow, PoolRow.id == NodeRow.pool_id)
        .outerjoin(ClusterRow, ClusterRow.name == PoolRow.cluster)
        .group_by(usage.c.tenant, usage.c.state, PoolRow.gpu_product, ClusterRow.region)
    )


def _usage(rows: Iterable[Sequence[Any]]) -> dict[str, TenantUsage]:
    """Rows of (tenant, state, product, region, GPUs) -> each tenant's usage."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    held: dict[str, dict[tuple[str, str], int]] = defaultdict(lambda: defaultdict(int))
    for tenant, state, product, region, gpus in rows:
        counts[tenant][0 if state in (*HELD_STATES, "releasing") else 1] += int(gpus)
        if product is not None and region is not None:
            held[tenant][(product, region)] += int(gpus)
    return {
        tenant: TenantUsage(
            active=active,
            in_flight=in_flight,
            held=tuple((product, region, gpus) for (product, region), gpus in sorted(held[tenant].items())),
        )
        for tenant, (active, in_flight) in counts.items()
    }


async def tenant_usage(
    session: AsyncSession, exclude_allocation: str | None = None, tenants: Collection[str] | None = None
) -> dict[str, TenantUsage]:
    """tenant -> what it holds (of `tenants` only, when given: a claim's quota check needs its cohort tree's).
    Releasing allocations still hold their GPUs until released."""
    parameters: dict[str, Any] = {"exclude": exclude_allocation or ""}
    if tenants is not None:
        parameters["tenants"] = list(tenants)
    return _usage(await session.execute(_usage_query(tenants is not None), parameters))


def _plans(rows: Iterable[Sequence[Any]]) -> dict[str, list[tuple[str, int]]]:
    plans: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for node, allocation, gpus in rows:
        plans[node].append((allocation, gpus))
    return plans


@dataclass(frozen=True)
class Inventory:
    """The placement inventory as PostgreSQL holds it, every slot free: what changes only when the fleet does."""

    version: int  # `inventory_version` when it was read; the data is at least that new
    snapshot: Snapshot  # every slot FREE, tenants with no usage
    slots: dict[int, tuple[str, int]]  # slot row id -> (node, the slot's position in that node's slots)
    rows_of: dict[str, tuple[int, ...]] = field(default_factory=dict)  # node -> its slot row ids (`slots` inverted)


def _rows_of(slots: dict[int, tuple[str, int]]) -> dict[str, tuple[int, ...]]:
    rows: dict[str, list[int]] = defaultdict(list)
    for ident, (node, _) in slots.items():
        rows[node].append(ident)
    return {node: tuple(idents) for node, idents in rows.items()}


@dataclass(frozen=True)
class LiveState:
    """What moves with every allocation: read fresh for every decision."""

    holders: dict[int, str]  # slot row id -> the allocation with an active claim on it
    unavailable: dict[int, str]  # slot row id -> its row state, where that is not `available`
    usage: dict[str, TenantUsage]  # tenant -> what it holds
    plans: dict[str, list[tuple[str, int]]]  # node -> allocations being planned there (empty when not asked for)
    cooling: dict[str, Cooling] = field(default_factory=dict)  # node -> its breaker's cool-off, where it has one


def _failures(rows: Iterable[Sequence[Any]]) -> dict[str, list[datetime]]:
    failures: dict[str, list[datetime]] = defaultdict(list)
    for node, at in rows:
        failures[node].append(at)
    return failures


async def load_snapshot(
    session: AsyncSession,
    exclude_allocation: str | None = None,
    *,
    pending: bool = True,
    breaker: BreakerPolicy | None = None,
) -> Snapshot:
    """The inventory as it is now, read whole. `exclude_allocation` leaves that allocation out of tenant usage and
    of the pending plans, so a request is not counted against itself. `pending=False` leaves pending plans out, for
    a caller that overlays them later (under a lock). Control workers use `store.inventory.InventoryCache`, which
    reads only the live state when the inventory has not changed. `breaker` leaves out nodes cooling off (default: the
    breaker's defaults)."""
    inventory = with_liveness(await load_inventory(session), await load_liveness(session))
    live = await load_live_state(session, exclude_allocation, pending=pending, breaker=breaker)
    return current_snapshot(inventory, live)


def with_liveness(inventory: Inventory, liveness: Liveness) -> Inventory:
    """The inventory with every node whose agent is not live marked so: the scheduler does not rank those."""
    down = [
        dataclasses.replace(node, agent_live=False)
        for name, node in inventory.snapshot.nodes.items()
        if name in liveness.down and node.agent_live
    ]
    return dataclasses.replace(inventory, snapshot=inventory.snapshot.with_nodes(down)) if down else inventory


async def load_inventory(session: AsyncSession) -> Inventory:
    version = int(await session.scalar(select(InventoryVersionRow.version)) or 0)  # first: the data is newer
    regions = [
        RegionView(
            name=r.name,
            status=RegionStatus(r.status),
            jurisdiction=r.jurisdiction,
            prices=dict(r.prices),
            queueing_strategy=QueueingStrategy(r.queueing_strategy),
        )
        for r in (await session.scalars(select(RegionRow))).all()
    ]
    classes = {c.name: c.spec for c in (await session.scalars(select(InferenceClassRow))).all()}
    clusters = {c.name: c for c in (await session.scalars(select(ClusterRow))).all()}

    slots_by_node, positions = await _read_slots(session)

    nodes_by_pool: dict[int, list[str]] = defaultdict(list)
    nodes: list[NodeView] = []
    node_rows = select(NodeRow.name, NodeRow.pool_id, NodeRow.status, NodeRow.labels, NodeRow.numa_nodes)
    for name, pool_id, status, labels, numa_nodes in await session.execute(node_rows.order_by(NodeRow.name)):
        nodes_by_pool[pool_id].append(name)
        nodes.append(_node_view(name, status, labels, numa_nodes, slots_by_node))

    pools: list[PoolView] = []
    for (p,) in await session.execute(select(PoolRow).where(PoolRow.shape != PoolShape.KUBERNETES.value)):
        cluster = clusters[p.cluster]
        devices = classes.get(p.class_name, {}).get("devices", [])
        status = ClusterStatus.model_validate(cluster.status) if cluster.status else None
        pools.append(
            PoolView(
                cluster=p.cluster,
                name=p.name,
                region=cluster.region or "",
                shape=PoolShape(p.shape),
                gpu_product=p.gpu_product,
                nodes=tuple(nodes_by_pool.get(p.id, ())),
                devices=tuple(
                    {k: v for k, v in d.items() if k in ("name", "driver", "attributes", "capacity")}
                    for d in devices
                    if d.get("claim", "DRA") == "DRA"
                ),
                cluster_labels=dict(cluster.labels),
                cluster_ready=status is None or status.ready,
                deadlines=dict(p.deadlines or {}),
                max_lease_seconds=p.max_lease_seconds,
            )
        )

    tenants = [tenant_view(t) for t in (await session.scalars(select(TenantRow))).all()]
    cohorts = [cohort_view(c) for c in (await session.scalars(select(CohortRow))).all()]
    snapshot = Snapshot(regions=regions, pools=pools, nodes=nodes, tenants=tenants, cohorts=cohorts)
    return Inventory(version=version, snapshot=snapshot, slots=positions, rows_of=_rows_of(positions))


# Plain column tuples rather than ORM objects: a large fleet has tens of thousands of slot rows.
_SLOT_COLUMNS = (
    SlotRow.id,
    SlotRow.node_id,
    SlotRow.slot_index,
    SlotRow.approved,
    SlotRow.fabric_claim_mode,
    SlotRow.fabric_vf_pci_address,
    SlotRow.numa_node,
    SlotRow.gpu_pci_address,
    SlotRow.fabric_parent_pci_address,
    SlotRow.nvme_device,
    SlotRow.vcpus,
    SlotRow.memory_mib,
    SlotRow.mac_address,
    SlotRow.private_ip,
    SlotRow.validation,
    SlotRow.validation_reason,
    SlotRow.health,
    SlotRow.health_reason,
)
_MODES = {m.value: m for m in FabricClaimMode}
_VALIDATIONS = {v.value: v for v in ValidationState}
_HEALTH = {h.value: h for h in HealthState}


_SLOT_BATCH = 20_000  # rows decoded at a time when every slot is read


async def _read_slots(
    session: AsyncSession, nodes: Collection[str] | None = None
) -> tuple[dict[str, list[SlotView]], dict[int, tuple[str, int]]]:
    """Every slot (or those of `nodes`), every one FREE: node -> its slots by index, and slot row id -> (node, the
    slot's position in that node's slots).

    Hosts of one model repeat the same PCI addresses, NVMe paths and validation reasons, and each row repeats its
    node's name: the driver decodes a new string for each, so they are interned (one copy per distinct value; about
    20 MB of a 10,000-node inventory). Every slot is read in keyset pages of `_SLOT_BATCH` rows, so the rows of the
    whole fleet are never held at once beside the views built from them: at 10,000 nodes the control worker holds
    239 MB instead of 267, and peaks at 268 instead of 306 while it loads (docs/benchmarks.md). Each page is a
    statement of its own, as the inventory's other reads are: a change between them moved the version read first,
    so the next decision takes it in."""
    query = select(*_SLOT_COLUMNS).order_by(SlotRow.node_id, SlotRow.slot_index)
    slots_by_node: dict[str, list[SlotView]] = defaultdict(list)
    positions: dict[int, tuple[str, int]] = {}

    def take(rows: Iterable[Row[Any]]) -> None:
        for row in rows:
            (
                ident,
                node,
                index,
                approved,
                mode,
                vf,
                numa,
                gpu,
                parent,
                nvme,
                vcpus,
                memory,
                mac,
                ip,
                valid,
                why,
                health,
                sick,
            ) = row
            node, held = intern(node), slots_by_node[node]
            positions[ident] = (node, len(held))
            held.append(
                SlotView(
                    id=slot_id(node, index),
                    index=index,
                    approved=approved,
                    fabric_claim_mode=_MODES[mode],
                    fabric_vf_pci=_interned(vf) or None,
                    numa_node=numa,
                    state=SlotState.FREE,
                    holder=None,
                    gpu_pci=intern(gpu),
                    fabric_parent_pci=_interned(parent),
                    nvme_device=_interned(nvme),
                    vcpus=vcpus,
                    memory_mib=memory,
                    mac=mac,
                    private_ip=ip,
                    validation=_VALIDATIONS[valid],
                    validation_reason=_interned(why),
                    health=_HEALTH[health],
                    health_reason=sick,
                )
            )

    if nodes is not None:
        take(await session.execute(query.where(among(SlotRow.node_id, sorted(nodes)))))
        return slots_by_node, positions
    after: tuple[str, int] | None = None
    while True:  # keyset pages: each one decoded and let go before the next is read
        page = query if after is None else query.where(tuple_(SlotRow.node_id, SlotRow.slot_index) > after)
        rows = (await session.execute(page.limit(_SLOT_BATCH))).all()
        take(rows)
        if len(rows) < _SLOT_BATCH:
            break
        after = (rows[-1][1], rows[-1][2])
        del rows
    return slots_by_node, positions


def _interned(value: str | None) -> str | None:
    return intern(value) if value is not None else None


def _node_view(
    name: str,
    status: str,
    labels: dict[str, str],
    numa_nodes: int,
    slots: dict[str, list[SlotView]],
    *,
    agent_live: bool = True,
) -> NodeView:
    return NodeView(
        name=name,
        status=NodeStatus(status),
        slots=tuple(slots.get(name, ())),
        labels=labels,
        numa_nodes=numa_nodes,
        agent_live=agent_live,
    )


@dataclass(frozen=True)
class NodeChanges:
    """Some nodes as PostgreSQL holds them now, to lay over a kept inventory (`with_changed_nodes`)."""

    version: int  # `inventory_version` read with them: if it moved past the inventory's, they cannot be laid over
    nodes: dict[str, NodeView]  # agent liveness applied; a node that is gone is missing
    slots: dict[int, tuple[str, int]]  # their slot row ids -> (node, position)


async def load_nodes(session: AsyncSession, names: Collection[str]) -> NodeChanges:
    """Read only these nodes: what a one-node change (a cordon, an agent's report) costs instead of a full read."""
    version = int(await session.scalar(select(InventoryVersionRow.version)) or 0)  # first, as in `load_inventory`
    live = exists().where(NodeAgentRow.node == NodeRow.name, NodeAgentRow.state == "live")
    rows = await session.execute(
        select(NodeRow.name, NodeRow.status, NodeRow.labels, NodeRow.numa_nodes, live).where(
            among(NodeRow.name, sorted(names))
        )
    )
    slots_by_node, positions = await _read_slots(session, names)
    nodes = {
        name: _node_view(name, status, labels, numa_nodes, slots_by_node, agent_live=bool(agent_live))
        for name, status, labels, numa_nodes, agent_live in rows
    }
    return NodeChanges(version=version, nodes=nodes, slots={k: v for k, v in positions.items() if v[0] in nodes})


def with_changed_nodes(inventory: Inventory, changes: NodeChanges) -> Inventory:
    """The inventory with these nodes replaced; each keeps its pool (a pool move moves `inventory_version`)."""
    slots, rows_of, new_rows = dict(inventory.slots), dict(inventory.rows_of), _rows_of(changes.slots)
    for name in changes.nodes:
        for ident in rows_of.pop(name, ()):
            del slots[ident]
        if name in new_rows:
            rows_of[name] = new_rows[name]
    slots.update(changes.slots)
    snapshot = inventory.snapshot.with_nodes(changes.nodes.values())
    return Inventory(version=inventory.version, snapshot=snapshot, slots=slots, rows_of=rows_of)


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)  # the module's own constants: literal, so partial indexes match


# Every decision reads this. One statement, each part one JSON array of rows, written out once: five statements
# through the driver and the ORM, or one built from SQLAlchemy expressions per call (its cache key alone costs more
# than the query), spent more of the control worker's CPU than PostgreSQL spends answering (docs/benchmarks.md,
# "Performance"). One statement is also one snapshot: the parts agree with one another.
_LIVE_STATE = text(
    "SELECT "
    "(SELECT coalesce(json_agg(json_build_array(c.slot_id, c.allocation_id)), '[]') "
    " FROM allocation_resource_claims AS c WHERE c.released_at IS NULL), "
    "(SELECT coalesce(json_agg(json_build_array(s.id, s.state)), '[]') "
    " FROM node_resource_slots AS s WHERE s.state <> 'available'), "
    "(SELECT coalesce(json_agg(json_build_array(g.tenant, g.state, g.product, g.region, g.gpus)), '[]') FROM "
    " (SELECT u.tenant, u.state, p.gpu_product AS product, c.region, sum(u.gpus) AS gpus FROM "
    "  (SELECT a.tenant, a.state, a.node_id AS node, a.gpu_count AS gpus FROM allocations AS a "
    f"   WHERE (a.state IN ({_sql_list((*IN_FLIGHT_STATES, *HELD_STATES))}) OR (a.state = 'releasing' AND EXISTS "
    "    (SELECT 1 FROM allocation_resource_claims AS h WHERE h.allocation_id = a.id AND h.released_at IS NULL))) "
    "    AND a.id <> :exclude "
    "    AND NOT EXISTS (SELECT 1 FROM queue_entries AS w WHERE w.allocation_id = a.id AND w.node IS NOT NULL) "
    "   UNION ALL SELECT q.tenant, 'placing', q.node, q.gpu_count FROM queue_entries AS q "
    "   WHERE q.node IS NOT NULL AND q.allocation_id <> :exclude) AS u "
    "  LEFT JOIN nodes AS n ON n.name = u.node LEFT JOIN pools AS p ON p.id = n.pool_id "
    "  LEFT JOIN clusters AS c ON c.name = p.cluster "
    "  GROUP BY u.tenant, u.state, p.gpu_product, c.region) AS g), "
    "(SELECT coalesce(json_agg(json_build_array(p.node, p.id, p.gpus) ORDER BY p.id), '[]') FROM "
    " (SELECT a.node_id AS node, a.id, a.gpu_count AS gpus "
    f"  FROM allocations AS a WHERE :pending AND a.state IN ({_sql_list(PLANNING_STATES)}) "
    "   AND a.node_id IS NOT NULL AND a.id <> :exclude "
    "  UNION ALL SELECT q.node, q.allocation_id, q.gpu_count FROM queue_entries AS q "
    "   WHERE :pending AND q.node IS NOT NULL AND q.allocation_id <> :exclude) AS p), "
    "(SELECT coalesce(json_agg(json_build_array(e.node_id, e.at)), '[]') FROM allocation_events AS e "
    " WHERE :breaker AND e.step = 'attempt_failed' AND e.at > :since AND e.node_id IS NOT NULL "
    "  AND (e.reason IS NULL OR e.reason NOT LIKE ALL (:not_the_node)))"
).columns(holders=JSON, unavailable=JSON, usage=JSON, plans=JSON, failures=JSON)
_NOT_THE_NODE = [code.replace("_", "\\_") + ":%" for code in NOT_THE_NODES_FAULT]  # LIKE patterns, `_` escaped


async def load_live_state(
    session: AsyncSession,
    exclude_allocation: str | None = None,
    *,
    pending: bool = True,
    breaker: BreakerPolicy | None = None,
    now: datetime | None = None,
) -> LiveState:
    """Claims, slot states, usage, plans in progress and the nodes cooling off, as of `now` (default: the clock)."""
    policy = breaker or BreakerPolicy()
    at = now or datetime.now(UTC)
    parameters = {
        "exclude": exclude_allocation or "",
        "pending": pending,
        "breaker": policy.threshold > 0,
        "since": at - policy.lookback,
        "not_the_node": _NOT_THE_NODE,
    }
    holders, unavailable, usage, plans, failures = (await session.execute(_LIVE_STATE, parameters)).one()
    return LiveState(
        holders={int(ident): allocation for ident, allocation in holders},
        unavailable={int(ident): state for ident, state in unavailable},
        usage=_usage(usage),
        plans=_plans(plans),
        cooling=cooling_nodes(_failures((node, datetime.fromisoformat(t)) for node, t in failures), policy, at),
    )


# A node's live state, as far as its snapshot view depends on it: (position, state, holder) of each claimed or
# quarantined slot, in order, and its breaker cool-off.
NodeLive = tuple[tuple[tuple[int, SlotState, str | None], ...], Cooling | None]


@dataclass(frozen=True)
class Overlay:
    """An inventory with claims, quarantines and cool-offs laid over it, and what each node's view was built from:
    the next decision rebuilds only the nodes whose live state moved since (`overlay`)."""

    inventory: Inventory
    snapshot: Snapshot  # tenants and plans in progress not yet applied
    live_of: dict[str, NodeLive]  # the nodes that differ from the inventory, and why


def _live_of(inventory: Inventory, live: LiveState) -> dict[str, NodeLive]:
    slots: dict[str, list[tuple[int, SlotState, str | None]]] = defaultdict(list)
    for ident in live.holders.keys() | live.unavailable.keys():
        if ident not in inventory.slots:
            continue  # a slot added since the inventory was read: the next read has it
        node, position = inventory.slots[ident]
        state = SlotState.QUARANTINED if live.unavailable.get(ident) == "quarantined" else SlotState.CLAIMED
        slots[node].append((position, state, live.holders.get(ident)))
    nodes = inventory.snapshot.nodes
    cooling = {node: until for node, until in live.cooling.items() if node in nodes}
    return {node: (tuple(sorted(slots.get(node, ()))), cooling.get(node)) for node in slots.keys() | cooling.keys()}


def overlay(inventory: Inventory, live: LiveState, previous: Overlay | None = None) -> Overlay:
    """The inventory with the live state laid over it. From `previous` (the same inventory, an earlier live state)
    only the nodes whose claims, quarantines or cool-off moved are rebuilt: with hundreds of allocations holding
    slots, rebuilding every holding node's view per decision was most of a decision's CPU."""
    live_of = _live_of(inventory, live)
    if previous is None or previous.inventory is not inventory:
        previous = Overlay(inventory=inventory, snapshot=inventory.snapshot, live_of={})
    moved = {
        node for node in live_of.keys() | previous.live_of.keys() if live_of.get(node) != previous.live_of.get(node)
    }
    if not moved:
        return Overlay(inventory=inventory, snapshot=previous.snapshot, live_of=live_of)
    base = inventory.snapshot.nodes
    rebuilt = []
    for node in moved:
        claimed, cooling = live_of.get(node, ((), None))
        slots = list(base[node].slots)
        for position, state, holder in claimed:
            slots[position] = dataclasses.replace(slots[position], state=state, holder=holder)
        rebuilt.append(dataclasses.replace(base[node], slots=tuple(slots), cooling_off=cooling))
    return Overlay(inventory=inventory, snapshot=previous.snapshot.with_nodes(rebuilt), live_of=live_of)


def with_usage(snapshot: Snapshot, live: LiveState) -> Snapshot:
    """Tenant usage and the plans in progress laid over a snapshot."""
    snapshot = snapshot.with_tenants(
        dataclasses.replace(
            tenant,
            active_gpus=(usage := live.usage.get(tenant.name, NO_USAGE)).active,
            in_flight_gpus=usage.in_flight,
            held=usage.held,
        )
        for tenant in snapshot.tenants.values()
    )
    return with_pending_plans(snapshot, live.plans) if live.plans else snapshot


def current_snapshot(inventory: Inventory, live: LiveState) -> Snapshot:
    """The inventory with the live state laid over it: claimed, reserved and quarantined slots, tenant usage and
    the plans in progress, and the breaker's cool-offs. Only the nodes with such slots, or cooling off, are rebuilt."""
    return with_usage(overlay(inventory, live).snapshot, live)
