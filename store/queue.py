"""The queues of requests waiting for capacity: entries, what each admission pass decided, reservations.

    allocation workflow --enter--> queue_entries (arrival kept on every re-entry: a woken request that no longer
                                   fits goes back to its place, not to the end)
    admission pass --entries, holdings--> scheduler.admission.admit --record_pass--> node set aside / reason /
                                   reserved node per entry
    placement --reserved_nodes, leave--> nodes held for a head left out; the entry goes when a placement is chosen
    API --entries--> GET /v1/queues, an allocation's place

An entry holds nothing: its set-aside node counts as a plan in progress (`store.snapshot`) only until the woken
allocation's own placement decision replaces it, or the next pass moves it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, bindparam, case, delete, func, null, or_, select, text, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.placement import PlacementRequest
from scheduler.admission.admit import Nomination, QueuedRequest
from scheduler.admission.preemption import Running
from store.db import among
from store.models import AllocationRow, ClaimRow, PriorityClassRow, QueueEntryRow
from store.snapshot import holds_gpus


@dataclass(frozen=True)
class QueueEntry:
    allocation_id: str
    tenant: str
    region: str
    priority: int
    priority_class: str | None
    gpu_count: int
    request: dict[str, Any]  # contracts.placement.PlacementRequest, as JSON
    arrival: int
    enqueued_at: datetime
    deadline_at: datetime
    node: str | None
    reserved_node: str | None
    reason: str | None
    code: str | None
    woken_at: datetime | None
    nominated_node: str | None = None
    victims: list[str] | None = None
    created_at: datetime | None = None  # when the allocation was requested (preemption's "newer" compares it)

    def queued(self, fact: PriorityClassFacts | None = None) -> QueuedRequest:
        """The entry as the scheduler's queue holds it (the request with its tenant; `fact`: its PriorityClass's)."""
        request = PlacementRequest.model_validate(self.request).model_copy(update={"tenant": self.tenant})
        return QueuedRequest(
            allocation_id=self.allocation_id,
            tenant=self.tenant,
            region=self.region,
            priority=self.priority,
            arrival=self.arrival,
            request=request,
            enqueued=self.enqueued_at.timestamp(),
            created=(self.created_at or self.enqueued_at).timestamp(),
            preemptible=fact is not None and fact.preemptible,
            never_preempts=fact is not None and fact.never_preempts,
        )

    @property
    def nomination(self) -> Nomination | None:
        """What an earlier pass decided to preempt for it, if anything."""
        if not self.victims:
            return None
        return Nomination(self.nominated_node, tuple(self.victims))


@dataclass(frozen=True)
class PassRecord:
    """One entry's verdict from a pass, as stored."""

    allocation_id: str
    node: str | None
    reserved_node: str | None
    reason: str | None
    code: str | None
    nominated_node: str | None = None
    victims: tuple[str, ...] | None = None  # None: no preemption for it


_COLUMNS = (
    QueueEntryRow.allocation_id,
    QueueEntryRow.tenant,
    QueueEntryRow.region,
    QueueEntryRow.priority,
    QueueEntryRow.priority_class,
    QueueEntryRow.gpu_count,
    QueueEntryRow.request,
    QueueEntryRow.arrival,
    QueueEntryRow.enqueued_at,
    QueueEntryRow.deadline_at,
    QueueEntryRow.node,
    QueueEntryRow.reserved_node,
    QueueEntryRow.reason,
    QueueEntryRow.code,
    QueueEntryRow.woken_at,
    QueueEntryRow.nominated_node,
    QueueEntryRow.victims,
    select(AllocationRow.created_at).where(AllocationRow.id == QueueEntryRow.allocation_id).scalar_subquery(),
)


async def enter(
    session: AsyncSession,
    *,
    allocation_id: str,
    tenant: str,
    region: str,
    priority: int,
    priority_class: str | None,
    request: dict[str, Any],
    gpu_count: int,
    deadline_at: datetime,
    reason: str,
    code: str,
) -> None:
    """Put the allocation in its region's queue, or, if it is there already (woken, and it did not fit after all),
    keep its place and forget the node set aside for it. Idempotent."""
    values = {
        "allocation_id": allocation_id,
        "tenant": tenant,
        "region": region,
        "priority": priority,
        "priority_class": priority_class,
        "request": request,
        "gpu_count": gpu_count,
        "deadline_at": deadline_at,
        "reason": reason,
        "code": code,
    }
    statement = insert(QueueEntryRow).values(**values)
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[QueueEntryRow.allocation_id],
            set_={"node": None, "reason": statement.excluded.reason, "code": statement.excluded.code},
        )
    )


async def leave(session: AsyncSession, allocation_id: str) -> bool:
    """Take the allocation out of its queue (placed, timed out or cancelled); whether it was there."""
    result = await session.execute(delete(QueueEntryRow).where(QueueEntryRow.allocation_id == allocation_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def entries(session: AsyncSession, *, region: str | None = None) -> list[QueueEntry]:
    """Every queue (or one region's), in order of arrival."""
    query = select(*_COLUMNS).order_by(QueueEntryRow.arrival)
    if region is not None:
        query = query.where(QueueEntryRow.region == region)
    return [QueueEntry(*row) for row in await session.execute(query)]


async def entry(session: AsyncSession, allocation_id: str) -> QueueEntry | None:
    row = (await session.execute(select(*_COLUMNS).where(QueueEntryRow.allocation_id == allocation_id))).first()
    return QueueEntry(*row) if row is not None else None


async def queued_regions(session: AsyncSession, among: Collection[str] | None = None) -> list[str]:
    """The regions with an entry in their queue (of `among`, when given), in name order."""
    query = select(QueueEntryRow.region).distinct().order_by(QueueEntryRow.region)
    if among is not None:
        query = query.where(QueueEntryRow.region.in_(list(among)))
    return list((await session.scalars(query)).all())


async def forget_set_asides(session: AsyncSession, region: str, keep: Collection[str] = ()) -> None:
    """A pass judges the queue again: what the last one set aside or reserved is forgotten first (in the pass's
    transaction, under the region's lock, so nobody sees the queue without them), but for the entries in `keep`
    (woken lately: placing themselves on their node)."""
    await session.execute(
        update(QueueEntryRow)
        .where(QueueEntryRow.region == region, QueueEntryRow.allocation_id.not_in(list(keep)))
        .where(or_(QueueEntryRow.node.is_not(None), QueueEntryRow.reserved_node.is_not(None)))
        .values(node=None, reserved_node=None)
    )


async def has_reservation(session: AsyncSession, region: str) -> bool:
    """Whether a node of the region is held for the head of its queue."""
    held = select(QueueEntryRow.allocation_id).where(
        QueueEntryRow.region == region, QueueEntryRow.reserved_node.is_not(None)
    )
    return bool(await session.scalar(select(held.exists())))


async def record_pass(session: AsyncSession, records: Iterable[PassRecord]) -> None:
    """What a pass decided for each entry it judged (an entry that left the queue meanwhile matches nothing)."""
    rows = [
        {
            "key": r.allocation_id,
            "node": r.node,
            "reserved_node": r.reserved_node,
            "reason": r.reason,
            "code": r.code,
            "nominated_node": r.nominated_node,
            "victims": list(r.victims) if r.victims is not None else None,
            "nominating": r.victims is not None,
        }
        for r in records
    ]
    if not rows:
        return
    table = QueueEntryRow.__table__
    statement = (
        update(table)  # a Core statement: one executemany
        .where(table.c.allocation_id == bindparam("key"))
        .values(
            node=bindparam("node"),
            reserved_node=bindparam("reserved_node"),
            reason=bindparam("reason"),
            code=bindparam("code"),
            nominated_node=bindparam("nominated_node"),
            victims=bindparam("victims", type_=JSONB),
            # When the nomination was first decided: kept while it stands, gone with it.
            nominated_at=case(
                (bindparam("nominating", type_=Boolean).is_(False), null()),
                (table.c.nominated_at.is_(None), func.now()),
                else_=table.c.nominated_at,
            ),
        )
    )
    await session.execute(statement, rows)


async def mark_woken(session: AsyncSession, allocation_ids: list[str], at: datetime) -> None:
    if allocation_ids:
        await session.execute(
            update(QueueEntryRow).where(among(QueueEntryRow.allocation_id, allocation_ids)).values(woken_at=at)
        )


# Read by every placement decision: a plain statement, built once.
_RESERVED_NODES = text(
    "SELECT allocation_id, node, reserved_node FROM queue_entries "
    "WHERE reserved_node IS NOT NULL OR allocation_id = :allocation"
)


async def reserved_nodes(session: AsyncSession, allocation_id: str | None = None) -> frozenset[str]:
    """Nodes held for the head of a queue that a decision about `allocation_id` must leave alone: every one but its
    own, and none at all when a pass set a node aside for it (it comes before the head in its queue's order)."""
    rows = await session.execute(_RESERVED_NODES, {"allocation": allocation_id or ""})
    reserved: set[str] = set()
    for entry, node, held in rows:
        if entry == allocation_id:
            if node is not None:
                return frozenset()
        elif held is not None:
            reserved.add(held)
    return frozenset(reserved)


async def holdings(session: AsyncSession) -> list[tuple[str, str, int]]:
    """(tenant, node, GPUs) of every allocation holding or being placed on a node, and of every queued request a
    pass set a node aside for: what fair shares are computed from."""
    placed = select(AllocationRow.tenant, AllocationRow.node_id, AllocationRow.gpu_count).where(
        holds_gpus(), AllocationRow.node_id.is_not(None)
    )
    admitted = select(QueueEntryRow.tenant, QueueEntryRow.node, QueueEntryRow.gpu_count).where(
        QueueEntryRow.node.is_not(None)
    )
    return [(tenant, node, int(gpus)) for tenant, node, gpus in await session.execute(placed.union_all(admitted))]


async def queue_lengths(session: AsyncSession) -> list[tuple[str, str, int, int, float]]:
    """(region, tenant, priority, entries, longest wait in seconds) for the metrics."""
    wait = func.max(func.extract("epoch", func.now() - QueueEntryRow.enqueued_at))
    rows = await session.execute(
        select(QueueEntryRow.region, QueueEntryRow.tenant, QueueEntryRow.priority, func.count(), wait).group_by(
            QueueEntryRow.region, QueueEntryRow.tenant, QueueEntryRow.priority
        )
    )
    return [(region, tenant, int(priority), int(count), float(w or 0)) for region, tenant, priority, count, w in rows]


@dataclass(frozen=True)
class PriorityClassFacts:
    value: int
    preemptible: bool
    grace_seconds: float
    never_preempts: bool = False  # `preemptionPolicy: Never`
    non_preemptible: bool = False  # `nonPreemptible`: never a victim, admitted within nominal quota only


@dataclass(frozen=True)
class PriorityClasses:
    facts: dict[str, PriorityClassFacts]
    default: str | None

    def of(self, named: str | None) -> tuple[str | None, PriorityClassFacts | None]:
        """The class a request that named `named` has (the default when it named none, or one no longer defined)
        and its facts; (None, None) when there is no such class."""
        name = named if named in self.facts else self.default
        return name, self.facts.get(name) if name is not None else None

    def preemptible(self, named: str | None) -> bool:
        """Whether a request that named `named` is of a preemptible class."""
        _, fact = self.of(named)
        return fact is not None and fact.preemptible


async def is_preemptible(session: AsyncSession, allocation_id: str) -> bool:
    """Whether the allocation asked for a preemptible PriorityClass (by name, or as its tenant's default class)."""
    named = await session.scalar(
        select(AllocationRow.request["priority_class"].astext).where(AllocationRow.id == allocation_id)
    )
    return (await class_facts(session)).preemptible(named)


async def class_facts(session: AsyncSession) -> PriorityClasses:
    """Every PriorityClass's value, whether it is preemptible and its grace period; and the default class's name."""
    rows = await session.execute(
        select(
            PriorityClassRow.name,
            PriorityClassRow.value,
            PriorityClassRow.preemptible,
            PriorityClassRow.grace_seconds,
            PriorityClassRow.is_default,
            PriorityClassRow.never_preempts,
            PriorityClassRow.non_preemptible,
        )
    )
    facts, default = {}, None
    for name, value, preemptible, grace, is_default, never, non_preemptible in rows:
        facts[name] = PriorityClassFacts(
            int(value), bool(preemptible), float(grace), bool(never), bool(non_preemptible)
        )
        default = name if is_default else default
    return PriorityClasses(facts, default)


@dataclass(frozen=True)
class ActiveAllocation:
    """A running allocation as preemption weighs it, with the facts its notice needs."""

    running: Running
    priority_class: str | None
    grace_seconds: float


async def active_allocations(session: AsyncSession, region: str) -> list[ActiveAllocation]:
    """The region's active allocations (not those already told to leave), each with its PriorityClass (the one its
    request named, else the default) and when it started holding (its first live claim)."""
    classes = await class_facts(session)
    started = (
        select(ClaimRow.allocation_id, func.min(ClaimRow.claimed_at).label("since"))
        .where(ClaimRow.released_at.is_(None))
        .group_by(ClaimRow.allocation_id)
        .subquery()
    )
    rows = await session.execute(
        select(
            AllocationRow.id,
            AllocationRow.tenant,
            AllocationRow.node_id,
            AllocationRow.gpu_count,
            AllocationRow.borrowed_gpus,
            AllocationRow.request["priority_class"].astext,
            started.c.since,
            AllocationRow.created_at,
        )
        .join(started, started.c.allocation_id == AllocationRow.id)
        .where(AllocationRow.region == region, AllocationRow.state == "active", AllocationRow.node_id.is_not(None))
    )
    result = []
    for allocation_id, tenant, node, gpus, borrowed, named, since, created in rows:
        name, fact = classes.of(named)
        running = Running(
            allocation_id,
            tenant,
            node,
            int(gpus),
            fact.value if fact else 0,
            since.timestamp(),
            borrowed=int(borrowed),
            preemptible=bool(fact and fact.preemptible),
            created=created.timestamp(),
            non_preemptible=bool(fact and fact.non_preemptible),
        )
        result.append(ActiveAllocation(running, name, fact.grace_seconds if fact else 30.0))
    return result


async def priority_classes(session: AsyncSession) -> dict[str, tuple[int, bool]]:
    """name -> (value, whether it is the default)."""
    rows = await session.execute(select(PriorityClassRow.name, PriorityClassRow.value, PriorityClassRow.is_default))
    return {name: (int(value), bool(is_default)) for name, value, is_default in rows}


async def waiting_ahead(session: AsyncSession, region: str, priority: int) -> list[tuple[str, int, int, str | None]]:
    """(tenant, GPUs, priority, the last verdict's code) of the entries of the region's queue a newcomer of `priority` might wait behind: as
    high or higher, and not yet given a node by a pass (a StrictFIFO queue lets nobody pass them); which of them go
    before it is the queue's order's to say (`scheduler.admission.admit.classic_key`)."""
    rows = await session.execute(
        select(QueueEntryRow.tenant, QueueEntryRow.gpu_count, QueueEntryRow.priority, QueueEntryRow.code).where(
            QueueEntryRow.region == region, QueueEntryRow.priority >= priority, QueueEntryRow.node.is_(None)
        )
    )
    return [(tenant, int(gpus), int(entry_priority), code) for tenant, gpus, entry_priority, code in rows]
