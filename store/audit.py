"""The reconciler's records (migration 0005): each audit run, what it found, and every repair it made.

`audit_runs` and `audit_findings` answer "what is wrong now" (the latest finished run) and "since when" (a finding
keeps the first_seen of the same drift in the run before). `audit_repairs` is the audit trail of the reconciler
itself: it is never pruned, and a repair of an allocation's claims or VM also writes an `allocation_events` row, so
the allocation's own story says what the reconciler did to it. Old runs (and their findings) are pruned after
`KEEP_RUNS_DAYS`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, String, Text, delete, func, select, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from contracts.allocation import FINAL_STATES, HealthNotice
from contracts.audit import (
    AllocationFact,
    AuditReport,
    ClaimFact,
    ControlFacts,
    FailedSlotFact,
    Finding,
    FindingKind,
    NominationFact,
    OpenReservationFact,
    Repair,
    RepairAction,
    ReservationFact,
    SlotFact,
    UsageDriftFact,
)
from store import reservations, usage
from store.models import (
    AllocationEventRow,
    AllocationRow,
    Base,
    ClaimRow,
    NodeAgentRow,
    NodeRow,
    PoolRow,
    QueueEntryRow,
    SlotRow,
)
from store.queue import class_facts

KEEP_RUNS_DAYS = 14


class AuditRunRow(Base):
    __tablename__ = "audit_runs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    workflow_id: Mapped[str] = mapped_column(String(255), nullable=False)
    trigger: Mapped[str] = mapped_column(String(32), nullable=False)
    repair: Mapped[bool] = mapped_column(Boolean, nullable=False)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    nodes_checked: Mapped[list[str]] = mapped_column(JSONB, nullable=False, default=list)


class AuditFindingRow(Base):
    __tablename__ = "audit_findings"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("audit_runs.id", ondelete="CASCADE"), nullable=False, index=True)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    node: Mapped[str | None] = mapped_column(String(253))
    allocation_id: Mapped[str | None] = mapped_column(String(255))
    slot_indexes: Mapped[list[int]] = mapped_column(JSONB, nullable=False, default=list)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    repair: Mapped[str | None] = mapped_column(String(32))
    blocked: Mapped[str | None] = mapped_column(Text)


class AuditRepairRow(Base):
    __tablename__ = "audit_repairs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("audit_runs.id", ondelete="SET NULL"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    action: Mapped[str] = mapped_column(String(32), nullable=False)
    node: Mapped[str | None] = mapped_column(String(253))
    allocation_id: Mapped[str | None] = mapped_column(String(255))
    slot_indexes: Mapped[list[int]] = mapped_column(JSONB, nullable=False, default=list)
    outcome: Mapped[str] = mapped_column(String(16), nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)


# Facts ----------------------------------------------------------------------------------------------------------------


async def gpu_failure_notice(session: AsyncSession, node: str, index: int) -> HealthNotice:
    """What an allocation on `node`'s slot `index` is told of its failed GPU: the verdict's reason, and whether its
    pool replaces it (`onGpuFailure`)."""
    row = (
        await session.execute(
            select(SlotRow.health_reason, PoolRow.on_gpu_failure)
            .join(NodeRow, NodeRow.name == SlotRow.node_id)
            .join(PoolRow, PoolRow.id == NodeRow.pool_id)
            .where(SlotRow.node_id == node, SlotRow.slot_index == index)
        )
    ).first()
    reason, policy = row if row is not None else (None, "Tell")
    return HealthNotice(slot=f"{node}/{index}", reason=reason or "failed", replace=policy == "Replace")


async def live_agent_nodes(session: AsyncSession) -> list[str]:
    """The nodes whose agent is live: the ones the audit asks for their VMs and leases."""
    return list((await session.scalars(select(NodeAgentRow.node).where(NodeAgentRow.state == "live"))).all())


# The reconciler compares the last day's claims with the usage ledger each minute (older drift is `drift(since=None)`).
USAGE_DRIFT_WINDOW = timedelta(days=1)


async def control_facts(session: AsyncSession) -> ControlFacts:
    """Active claims, unavailable slots and unfinished allocations. Call in one REPEATABLE READ transaction, so that a
    claim and its slot are seen as one moment (they always change together)."""
    claims = await session.execute(
        select(ClaimRow.allocation_id, ClaimRow.node_id, SlotRow.id, SlotRow.slot_index, ClaimRow.claimed_at)
        .join(SlotRow, SlotRow.id == ClaimRow.slot_id)
        .where(ClaimRow.released_at.is_(None))
    )
    nominations = await session.execute(
        select(
            QueueEntryRow.allocation_id,
            QueueEntryRow.nominated_node,
            QueueEntryRow.victims,
            QueueEntryRow.nominated_at,
            AllocationRow.gpu_count,
        )
        .join(AllocationRow, AllocationRow.id == QueueEntryRow.allocation_id)
        .where(QueueEntryRow.nominated_node.is_not(None), QueueEntryRow.nominated_at.is_not(None))
    )
    slots = await session.execute(
        select(SlotRow.node_id, SlotRow.id, SlotRow.slot_index, SlotRow.state, SlotRow.quarantine_reason)
        .where(SlotRow.state != "available")
        .order_by(SlotRow.node_id, SlotRow.slot_index)
    )
    allocations = await session.execute(
        select(
            AllocationRow.id,
            AllocationRow.state,
            AllocationRow.node_id,
            AllocationRow.ends_at,
            AllocationRow.request["priority_class"].astext,
        ).where(AllocationRow.state.not_in(FINAL_STATES))
    )
    classes = await class_facts(session)
    return ControlFacts(
        claims=[
            ClaimFact(allocation_id=a, node=n, slot_id=s, slot_index=i, claimed_at=at) for a, n, s, i, at in claims
        ],
        nominations=[
            NominationFact(allocation_id=a, node=n, victims=list(v or []), nominated_at=at, gpus=g)
            for a, n, v, at, g in nominations
        ],
        reservations=await _reservation_facts(session),
        usage_drift=[
            UsageDriftFact(allocation_id=d.allocation_id, attempt=d.attempt, message=d.message)
            for d in await usage.drift(session, since=datetime.now(UTC) - USAGE_DRIFT_WINDOW)
        ],
        failed_slots=[
            FailedSlotFact(node=n, slot_index=i, reason=r)
            for n, i, r in await session.execute(
                select(SlotRow.node_id, SlotRow.slot_index, SlotRow.health_reason).where(SlotRow.health == "failed")
            )
        ],
        open_reservations=[
            OpenReservationFact(reservation_id=r.id, node=r.node_id, state=r.state)
            for r in await reservations.open_rows(session)
        ],
        slots=[SlotFact(node=n, slot_id=s, slot_index=i, state=st, quarantine_reason=r) for n, s, i, st, r in slots],
        allocations=[
            AllocationFact(allocation_id=a, state=st, node=n, ends_at=end, preemptible=classes.preemptible(named))
            for a, st, n, end, named in allocations
        ],
    )


async def _reservation_facts(session: AsyncSession) -> list[ReservationFact]:
    """The reservations whose GPUs are held for them (store.reservations.holds), with their nodes' usable GPUs."""
    held = await reservations.holds(session)
    counted = await session.execute(
        select(SlotRow.node_id, func.count())
        .where(SlotRow.approved.is_(True), SlotRow.state != "quarantined")
        .group_by(SlotRow.node_id)
    )
    usable = {node: int(count) for node, count in counted}
    return [
        ReservationFact(
            reservation_id=r.reservation_id,
            node=r.node,
            gpus=r.gpus,
            node_gpus=usable.get(r.node, 0),
            starts_at=datetime.fromtimestamp(r.window.start, UTC),
            ends_at=datetime.fromtimestamp(r.window.end, UTC),
        )
        for r in held
    ]


async def assessment_facts(session: AsyncSession) -> tuple[ControlFacts, list[Finding]]:
    """The control facts and the previous run's findings, read in one REPEATABLE READ transaction of `session`'s (a
    claim and its slot are seen as one moment). Call first thing in a fresh session: the isolation level applies to
    the transaction this begins."""
    async with session.begin():
        await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        return await control_facts(session), await previous_findings(session)


# Runs and findings ----------------------------------------------------------------------------------------------------


async def latest_run(session: AsyncSession) -> AuditRunRow | None:
    return await session.scalar(
        select(AuditRunRow).where(AuditRunRow.finished_at.is_not(None)).order_by(AuditRunRow.id.desc()).limit(1)
    )


async def findings_of(session: AsyncSession, run_id: int) -> list[Finding]:
    rows = await session.scalars(
        select(AuditFindingRow).where(AuditFindingRow.run_id == run_id).order_by(AuditFindingRow.id)
    )
    return [
        Finding(
            kind=FindingKind(row.kind),
            node=row.node,
            allocation_id=row.allocation_id,
            slot_indexes=row.slot_indexes,
            message=row.message,
            first_seen=row.first_seen,
            repair=RepairAction(row.repair) if row.repair else None,
            blocked=row.blocked,
        )
        for row in rows
    ]


async def previous_findings(session: AsyncSession) -> list[Finding]:
    """The findings of the latest finished run: a drift found there and again now keeps its first_seen."""
    run = await latest_run(session)
    return await findings_of(session, run.id) if run is not None else []


async def open_run(
    session: AsyncSession, workflow_id: str, trigger: str, repair: bool, nodes: list[str]
) -> AuditRunRow:
    run = AuditRunRow(workflow_id=workflow_id, trigger=trigger, repair=repair, nodes_checked=nodes)
    session.add(run)
    await session.flush()
    return run


async def record_findings(session: AsyncSession, run_id: int, findings: list[Finding]) -> None:
    for finding in findings:
        session.add(
            AuditFindingRow(
                run_id=run_id,
                kind=finding.kind.value,
                node=finding.node,
                allocation_id=finding.allocation_id,
                slot_indexes=finding.slot_indexes,
                message=finding.message,
                first_seen=finding.first_seen,
                repair=finding.repair.value if finding.repair else None,
                blocked=finding.blocked,
            )
        )


async def finish_run(session: AsyncSession, run_id: int) -> datetime | None:
    """Mark the run finished (once) and prune old runs; returns when it finished."""
    run = await session.get(AuditRunRow, run_id, with_for_update=True)
    if run is None:
        return None
    if run.finished_at is None:
        run.finished_at = await session.scalar(select(func.now()))
    horizon = func.now() - timedelta(days=KEEP_RUNS_DAYS)
    await session.execute(delete(AuditRunRow).where(AuditRunRow.started_at < horizon, AuditRunRow.id != run_id))
    return run.finished_at


# Repairs --------------------------------------------------------------------------------------------------------------


async def record_repair(session: AsyncSession, run_id: int | None, repair: Repair) -> None:
    """The reconciler's own trail, and the allocation's (when it has a row) in `allocation_events`."""
    session.add(
        AuditRepairRow(
            run_id=run_id,
            kind=repair.kind.value,
            action=repair.action.value,
            node=repair.node,
            allocation_id=repair.allocation_id,
            slot_indexes=repair.slot_indexes,
            outcome=repair.outcome,
            message=repair.message,
        )
    )
    if repair.allocation_id is None:
        return
    state = await session.scalar(select(AllocationRow.state).where(AllocationRow.id == repair.allocation_id))
    if state is None:
        return  # an orphan VM or lease of an allocation PostgreSQL never knew
    events = AllocationEventRow.__table__
    values: dict[str, Any] = {
        "allocation_id": repair.allocation_id,
        "event_key": f"reconciler:{run_id}:{repair.kind.value}:{repair.node or '-'}",
        "state": state,
        "step": f"reconciler_{repair.action.value}",
        "node_id": repair.node,
        "reason": f"{repair.kind.value}: {repair.message}",
        "detail": {"outcome": repair.outcome, "slots": repair.slot_indexes, "audit_run": run_id},
        "actor": RECONCILER,
    }
    await session.execute(
        insert(events)
        .values(values)
        .on_conflict_do_nothing(index_elements=[events.c.allocation_id, events.c.event_key])
    )


async def release_stale_claims(session: AsyncSession, allocation_id: str | None, node: str | None) -> int:
    """A teardown's control half: release the allocation's claims still active on the node and free their slots
    that are still reserved; how many claims were released. A claim released meanwhile is not counted again."""
    released = (
        (
            await session.execute(
                update(ClaimRow)
                .where(ClaimRow.allocation_id == allocation_id, ClaimRow.node_id == node)
                .where(ClaimRow.released_at.is_(None))
                .values(released_at=func.now())
                .returning(ClaimRow.slot_id)
            )
        )
        .scalars()
        .all()
    )
    freed = [slot_id for slot_id in released if slot_id is not None]
    await session.execute(
        update(SlotRow).where(SlotRow.id.in_(freed), SlotRow.state == "reserved").values(state="available")
    )
    return len(released)


async def make_available(session: AsyncSession, node: str | None, indexes: list[int], wanted: str) -> int:
    """Make the node's slots available again if they are still `wanted` (`reserved` with no active claim, or
    `quarantined`), clearing any quarantine reason; how many changed. The state is re-checked in the statement, so
    a slot that a workflow claimed or freed meanwhile is left alone."""
    query = update(SlotRow).where(SlotRow.node_id == node, SlotRow.slot_index.in_(indexes), SlotRow.state == wanted)
    if wanted == "reserved":
        active = select(ClaimRow.id).where(ClaimRow.slot_id == SlotRow.id, ClaimRow.released_at.is_(None))
        query = query.where(~active.exists())
    return (await session.execute(query.values(state="available", quarantine_reason=None))).rowcount or 0


async def locked_allocation(session: AsyncSession, allocation_id: str) -> AllocationRow | None:
    """The allocation's row, locked until the transaction ends, so that closing it cannot race its workflow's own
    last write."""
    return await session.get(AllocationRow, allocation_id, with_for_update=True)


RECONCILER = "berth:reconciler"  # who the trail says decided a repair (`record_repair`)


async def close_allocation(session: AsyncSession, row: AllocationRow, state: str, reason: str | None) -> None:
    """Make a row that `locked_allocation` returned final: `state`, `reason`, updated now."""
    row.state, row.failure_reason, row.updated_at = state, reason, func.now()
    await session.flush()


async def repairs_of(session: AsyncSession, run_id: int) -> list[Repair]:
    rows = await session.scalars(
        select(AuditRepairRow).where(AuditRepairRow.run_id == run_id).order_by(AuditRepairRow.id)
    )
    return [
        Repair(
            kind=FindingKind(r.kind),
            action=RepairAction(r.action),
            node=r.node,
            allocation_id=r.allocation_id,
            slot_indexes=r.slot_indexes,
            outcome=r.outcome,
            message=r.message,
            at=r.at,
        )
        for r in rows
    ]


async def report_of(session: AsyncSession, run: AuditRunRow) -> AuditReport:
    return AuditReport(
        run_id=run.id,
        workflow_id=run.workflow_id,
        trigger=run.trigger,
        repair=run.repair,
        started_at=run.started_at,
        finished_at=run.finished_at,
        nodes_checked=run.nodes_checked,
        findings=await findings_of(session, run.id),
        repairs=await repairs_of(session, run.id),
    )


async def findings_by_kind(session: AsyncSession) -> dict[str, int]:
    run = await latest_run(session)
    if run is None:
        return {}
    rows = await session.execute(
        select(AuditFindingRow.kind, func.count())
        .where(AuditFindingRow.run_id == run.id)
        .group_by(AuditFindingRow.kind)
    )
    return {kind: count for kind, count in rows}


async def repairs_by_kind(session: AsyncSession) -> dict[tuple[str, str], int]:
    rows = await session.execute(
        select(AuditRepairRow.kind, AuditRepairRow.outcome, func.count()).group_by(
            AuditRepairRow.kind, AuditRepairRow.outcome
        )
    )
    return {(kind, outcome): count for kind, outcome, count in rows}
