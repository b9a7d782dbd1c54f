"""Claims: the durable record of which allocation holds which slots (`allocation_resource_claims`), and the slot
states that go with them (`reserved`, `quarantined`, `available`).

Each function is one transaction's work and idempotent by (allocation, attempt): a retried call finds its own work
done and changes nothing. A double claim is impossible at three depths: the scheduler skips claimed slots,
`record_claims` locks and checks the slot rows, and the partial unique index refuses a second active claim outright.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from contracts.allocation import ClaimInput, HealthNotice
from scheduler import quota
from scheduler.cohorts import root_of
from store.models import AllocationRow, ClaimRow, CohortRow, NodeRow, PoolRow, SlotRow, TenantRow
from store.snapshot import NO_USAGE, cohort_view, tenant_usage, tenant_view


class ClaimConflict(Exception):
    """Another allocation holds (or the inventory lacks) a slot of the claim: the workflow moves on to another node."""


class QuotaExceeded(Exception):
    """The tenant's quota no longer has room for the claim (or the tenant is gone)."""


async def record_claims(sessions: async_sessionmaker[AsyncSession], claim: ClaimInput) -> list[int]:
    """Insert the claims and mark the slots reserved, re-checking the tenant's quota, in one transaction; the slots'
    ids. The transaction is opened here because the partial unique index's refusal (a concurrent claim that passed
    every check) surfaces only at the flush or the commit, and is the same `ClaimConflict` as one seen earlier."""
    try:
        async with sessions.begin() as session:
            return await _record(session, claim)
    except IntegrityError as exc:
        raise ClaimConflict(f"slots on {claim.node} were claimed concurrently by another allocation") from exc


async def _record(session: AsyncSession, claim: ClaimInput) -> list[int]:
    done = (
        await session.scalars(
            select(ClaimRow.slot_id).where(
                ClaimRow.allocation_id == claim.allocation_id, ClaimRow.attempt == claim.attempt
            )
        )
    ).all()
    if done:
        return sorted(s for s in done if s is not None)

    borrowed = await _check_quota(session, claim)

    indexes = sorted(b.slot_index for b in claim.bundles)
    slots = (
        await session.scalars(
            select(SlotRow)
            .where(SlotRow.node_id == claim.node, SlotRow.slot_index.in_(indexes))
            .order_by(SlotRow.slot_index)
            .with_for_update()
        )
    ).all()
    if [s.slot_index for s in slots] != indexes:
        missing = sorted(set(indexes) - {s.slot_index for s in slots})
        raise ClaimConflict(f"slots {missing} of {claim.node} are not in the inventory")
    taken = [s.slot_index for s in slots if s.state != "available"]
    if taken:
        raise ClaimConflict(f"slots {taken} of {claim.node} are already reserved or quarantined")
    by_index = {b.slot_index: b for b in claim.bundles}
    for slot in slots:
        slot.state = "reserved"
        session.add(
            ClaimRow(
                allocation_id=claim.allocation_id,
                attempt=claim.attempt,
                slot_id=slot.id,
                node_id=claim.node,
                bundle=by_index[slot.slot_index].model_dump(mode="json"),
            )
        )
    if borrowed:  # its own part of what its tenant borrows from the cohort: for the reader, and the usage reports
        await session.execute(
            update(AllocationRow).where(AllocationRow.id == claim.allocation_id).values(borrowed_gpus=borrowed)
        )
    await session.flush()
    return [s.id for s in slots]


_PLACE_OF_NODE = text(
    "SELECT p.gpu_product, c.region FROM nodes AS n JOIN pools AS p ON p.id = n.pool_id "
    "JOIN clusters AS c ON c.name = p.cluster WHERE n.name = :node"
)


async def _check_quota(session: AsyncSession, claim: ClaimInput) -> int:
    """The tenant's quotas, re-checked under lock (its total, and its quota for the node's product and region): how
    many of this allocation's GPUs are borrowed from its cohort tree (its own part of the tenant's excess: of 1 GPU,
    at most 1, however much its tenant borrowed before).

    Quota checks are serialised per tenant, and per cohort tree when the tenant is in one (every member's row
    locked, in name order): two allocations cannot both take the last headroom, nor the last GPUs a tree lends."""
    tenant = await session.get(TenantRow, claim.tenant, with_for_update=True)
    if tenant is None:
        raise QuotaExceeded(f"tenant {claim.tenant!r} does not exist")
    cohorts = {row.name: cohort_view(row) for row in (await session.scalars(select(CohortRow))).all()}
    members = [tenant]
    if tenant.cohort is not None:
        root = root_of(tenant.cohort, cohorts)
        in_cohorts = [name for name in _named_cohorts(await session.scalars(select(TenantRow.cohort).distinct()))
                      if root_of(name, cohorts) == root]  # fmt: skip
        members = list(
            (
                await session.scalars(
                    select(TenantRow).where(TenantRow.cohort.in_(in_cohorts)).order_by(TenantRow.name).with_for_update()
                )
            ).all()
        )
    usage = await tenant_usage(session, exclude_allocation=claim.allocation_id)
    views = [tenant_view(member, usage.get(member.name, NO_USAGE)) for member in members]
    product, region = (await session.execute(_PLACE_OF_NODE, {"node": claim.node})).one_or_none() or (None, None)
    view = next(v for v in views if v.name == tenant.name)
    decision = quota.decide_placement(
        view, product, region or "", claim.gpu_count, views, claim.within_nominal, cohorts
    )
    if not decision.fits:
        raise QuotaExceeded(decision.message)
    return min(claim.gpu_count, decision.borrowed)


def _named_cohorts(names: Iterable[str | None]) -> list[str]:
    return [name for name in names if name is not None]


async def release_claims(session: AsyncSession, allocation_id: str, attempt: int | None) -> int:
    """Release the allocation's active claims (of one attempt, or all) and free their reserved slots; how many were
    released. Quarantined slots stay quarantined: only the node agent's confirmed wipe lifts that."""
    query = select(ClaimRow).where(ClaimRow.allocation_id == allocation_id, ClaimRow.released_at.is_(None))
    if attempt is not None:
        query = query.where(ClaimRow.attempt == attempt)
    claims = (await session.scalars(query.with_for_update())).all()
    slot_ids = [c.slot_id for c in claims if c.slot_id is not None]
    for claim in claims:
        claim.released_at = func.now()
    if slot_ids:
        await session.execute(
            update(SlotRow).where(SlotRow.id.in_(slot_ids), SlotRow.state == "reserved").values(state="available")
        )
    return len(claims)


async def quarantine_slots(
    session: AsyncSession, allocation_id: str, attempt: int, node: str, slot_indexes: list[int], reason: str
) -> int:
    """The node could not confirm a wipe: keep its slots out of circulation (the reason names the allocation, which
    the reconciler reads back) and release the attempt's claims; how many slots."""
    await session.execute(
        update(SlotRow)
        .where(SlotRow.node_id == node, SlotRow.slot_index.in_(slot_indexes))
        .values(state="quarantined", quarantine_reason=f"{allocation_id}: {reason}")
    )
    claims = (
        await session.scalars(
            select(ClaimRow).where(
                ClaimRow.allocation_id == allocation_id, ClaimRow.attempt == attempt, ClaimRow.released_at.is_(None)
            )
        )
    ).all()
    for claim in claims:
        claim.released_at = func.now()
    return len(slot_indexes)


async def unquarantine_slots(session: AsyncSession, node: str, slot_indexes: list[int]) -> int:
    """The node agent confirmed the wipe: the slots still quarantined may be handed out again; how many were."""
    result = await session.execute(
        update(SlotRow)
        .where(SlotRow.node_id == node, SlotRow.slot_index.in_(slot_indexes))
        .where(SlotRow.state == "quarantined")
        .values(state="available", quarantine_reason=None)
    )
    return result.rowcount or 0


async def untold_failures(session: AsyncSession, node: str) -> list[tuple[str, HealthNotice]]:
    """The active allocations of `node` that hold a slot whose GPU its agent judged failed (issue 27) and have not
    been told yet (they are still `active`, not `degraded`): (allocation, what it is told), one per slot."""
    rows = await session.execute(
        select(ClaimRow.allocation_id, SlotRow.slot_index, SlotRow.health_reason, PoolRow.on_gpu_failure)
        .join(SlotRow, SlotRow.id == ClaimRow.slot_id)
        .join(AllocationRow, AllocationRow.id == ClaimRow.allocation_id)
        .join(NodeRow, NodeRow.name == SlotRow.node_id)
        .join(PoolRow, PoolRow.id == NodeRow.pool_id)
        .where(
            SlotRow.node_id == node, SlotRow.health == "failed", ClaimRow.released_at.is_(None),
            AllocationRow.state == "active",
        )
        .order_by(ClaimRow.allocation_id, SlotRow.slot_index)
    )  # fmt: skip
    return [
        (allocation, HealthNotice(slot=f"{node}/{index}", reason=reason or "failed", replace=policy == "Replace"))
        for allocation, index, reason, policy in rows
    ]
