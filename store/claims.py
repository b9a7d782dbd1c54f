"""Claims: the durable record of which allocation holds which slots (`allocation_resource_claims`), and the slot
states that go with them (`reserved`, `quarantined`, `available`).

Each function is one transaction's work and idempotent by (allocation, attempt): a retried call finds its own work
done and changes nothing. A double claim is impossible at three depths: the scheduler skips claimed slots,
`record_claims` locks and checks the slot rows, and the partial unique index refuses a second active claim outright.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlalchemy import func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from contracts.allocation import ClaimInput, HealthNotice
from scheduler.quota import accounts as quota
from scheduler.quota.cohorts import root_of
from store.models import AllocationRow, ClaimRow, ClusterRow, CohortRow, NodeRow, PoolRow, SlotRow, TenantRow
from store.snapshot import NO_USAGE, TenantUsage, cohort_view, tenant_usage, tenant_view
from store.trail import write_trail_in


class ClaimConflict(Exception):
    """Another allocation holds (or the inventory lacks) a slot of the claim: the workflow moves on to another node."""


class QuotaExceeded(Exception):
    """The tenant's quota no longer has room for the claim (or the tenant is gone)."""


async def record_claims(sessions: async_sessionmaker[AsyncSession], claim: ClaimInput) -> list[int]:
    """Insert the claims and mark the slots reserved, re-checking the tenant's quota, in one transaction, with the
    claim's trail (the steps before it); the slots' ids. The transaction is opened here because the partial unique
    index's refusal (a concurrent claim that passed every check) surfaces only at the flush or the commit, and is
    the same `ClaimConflict` as one seen earlier. A refused claim rolls its trail back with it: the caller writes
    the trail on its own then (a refusal is rare; one transaction is the common path's cost)."""
    try:
        async with sessions.begin() as session:
            await write_trail_in(session, claim.trail)
            return await _record(session, claim)
    except IntegrityError as exc:
        raise ClaimConflict(f"slots on {claim.node} were claimed concurrently by another allocation") from exc


# Whether this attempt's claims are in already (a retried step), and where the node is: one round trip.
_DONE_AND_PLACE = text(
    "SELECT (SELECT coalesce(array_agg(slot_id), '{}') FROM allocation_resource_claims "
    "        WHERE allocation_id = :allocation AND attempt = :attempt) AS done, p.gpu_product, c.region "
    "FROM (SELECT 1) AS one LEFT JOIN nodes AS n ON n.name = :node LEFT JOIN pools AS p ON p.id = n.pool_id "
    "LEFT JOIN clusters AS c ON c.name = p.cluster"
)

# The claim itself, all or nothing, in one statement: the wanted slots locked in index order (as every claim on the
# node locks them, so two claims never wait on each other crosswise), reserved only if every one is there and
# available, and a claim row per slot. `found` says what the locked rows were, for the refusal's message.
_CLAIM = text(
    """
    WITH wanted AS (
        SELECT (b ->> 'slot_index')::int AS slot_index, b AS bundle FROM jsonb_array_elements(CAST(:bundles AS jsonb)) AS b
    ), locked AS (
        SELECT s.id, s.slot_index, s.state FROM node_resource_slots AS s
        WHERE s.node_id = :node AND s.slot_index IN (SELECT slot_index FROM wanted)
        ORDER BY s.slot_index FOR UPDATE OF s
    ), reserved AS (
        UPDATE node_resource_slots AS s SET state = 'reserved' FROM locked AS l
        WHERE s.id = l.id AND l.state = 'available'
          AND (SELECT count(*) FROM locked WHERE state = 'available') = (SELECT count(*) FROM wanted)
        RETURNING s.id, s.slot_index
    ), claimed AS (
        INSERT INTO allocation_resource_claims (allocation_id, attempt, slot_id, node_id, bundle)
        SELECT :allocation, :attempt, r.id, :node, w.bundle FROM reserved AS r JOIN wanted AS w USING (slot_index)
        RETURNING slot_id, (bundle ->> 'slot_index')::int AS slot_index
    )
    SELECT (SELECT coalesce(json_agg(json_build_array(slot_index, state)), '[]') FROM locked) AS found,
           (SELECT coalesce(array_agg(slot_id ORDER BY slot_index), '{}') FROM claimed) AS claimed
    """
)


async def _record(session: AsyncSession, claim: ClaimInput) -> list[int]:
    """The claim in three round trips on the common path (where it is and whether it is in already; the quota's
    re-check; the claim), plain statements rather than ORM objects: this runs once per allocation, under the
    tenant's lock, so its cost bounds a tenant's placement rate."""
    keys = {"allocation": claim.allocation_id, "attempt": claim.attempt, "node": claim.node}
    done, product, region = (await session.execute(_DONE_AND_PLACE, keys)).one()
    if done:
        return sorted(s for s in done if s is not None)

    borrowed = await _check_quota(session, claim, product, region)

    indexes = sorted(b.slot_index for b in claim.bundles)
    bundles = json.dumps([b.model_dump(mode="json") for b in claim.bundles])
    found, claimed = (await session.execute(_CLAIM, keys | {"bundles": bundles})).one()
    if len(claimed) != len(indexes):
        states = {index: state for index, state in found}
        missing = [index for index in indexes if index not in states]
        if missing:
            raise ClaimConflict(f"slots {missing} of {claim.node} are not in the inventory")
        taken = [index for index in indexes if states[index] != "available"]
        raise ClaimConflict(f"slots {taken} of {claim.node} are already reserved or quarantined")
    if borrowed:  # its own part of what its tenant borrows from the cohort: for the reader, and the usage reports
        await session.execute(
            update(AllocationRow).where(AllocationRow.id == claim.allocation_id).values(borrowed_gpus=borrowed)
        )
    return list(claimed)


async def _check_quota(session: AsyncSession, claim: ClaimInput, product: str | None, region: str | None) -> int:
    """The tenant's quotas, re-checked under lock (its total, and its quota for the node's product and region): how
    many of this allocation's GPUs are borrowed from its cohort tree (its own part of the tenant's excess: of 1 GPU,
    at most 1, however much its tenant borrowed before).

    This is the judgement: the API's 409 (`api.feasibility.check_quota`) and the placement's refusal
    (`scheduler.placement.region`) ask the same arithmetic (`scheduler.quota.accounts`) earlier, for a fast answer,
    on usage that may have moved since; only here is the usage read under the lock that makes it true.

    Quota checks are serialised per tenant, and per cohort tree when the tenant is in one (every member's row
    locked, in name order): two allocations cannot both take the last headroom, nor the last GPUs a tree lends."""
    tenant = await session.get(TenantRow, claim.tenant, with_for_update=True)
    if tenant is None:
        raise QuotaExceeded(f"tenant {claim.tenant!r} does not exist")
    members, cohorts = [tenant], {}  # a tenant in no cohort has only its own quota to answer to
    if tenant.cohort is not None:
        cohorts = {row.name: cohort_view(row) for row in (await session.scalars(select(CohortRow))).all()}
        root = root_of(tenant.cohort, cohorts)
        in_cohorts = [
            name
            for name in _named_cohorts(await session.scalars(select(TenantRow.cohort).distinct()))
            if root_of(name, cohorts) == root
        ]
        members = list(
            (
                await session.scalars(
                    select(TenantRow).where(TenantRow.cohort.in_(in_cohorts)).order_by(TenantRow.name).with_for_update()
                )
            ).all()
        )
    usage = await tenant_usage(session, exclude_allocation=claim.allocation_id, tenants=[m.name for m in members])
    views = [tenant_view(member, usage.get(member.name, NO_USAGE)) for member in members]
    view = next(v for v in views if v.name == tenant.name)
    decision = quota.decide_placement(
        view, product, region or "", claim.gpu_count, views, claim.within_nominal, cohorts
    )
    if not decision.fits:
        raise QuotaExceeded(decision.message)
    if not decision.borrowed:
        return 0
    # Its own part of the excess, measured against what the tenant holds by claims: measured against requests
    # still being placed too, two placed at once would each record the same GPU as borrowed.
    claimed = await _claimed(session, [m.name for m in members], claim.allocation_id)
    settled = [tenant_view(member, claimed.get(member.name, NO_USAGE)) for member in members]
    mine = next(v for v in settled if v.name == tenant.name)
    own_part = quota.decide_placement(mine, product, region or "", claim.gpu_count, settled, False, cohorts)
    return min(claim.gpu_count, own_part.borrowed)


async def _claimed(session: AsyncSession, tenants: list[str], exclude: str) -> dict[str, TenantUsage]:
    """tenant -> the GPUs it holds by active claims (a request still being placed holds none), by product and
    region; `exclude`: the allocation being claimed."""
    rows = await session.execute(
        select(AllocationRow.tenant, PoolRow.gpu_product, ClusterRow.region, func.count())
        .select_from(ClaimRow)
        .join(AllocationRow, AllocationRow.id == ClaimRow.allocation_id)
        .join(NodeRow, NodeRow.name == ClaimRow.node_id)
        .join(PoolRow, PoolRow.id == NodeRow.pool_id)
        .join(ClusterRow, ClusterRow.name == PoolRow.cluster)
        .where(ClaimRow.released_at.is_(None), AllocationRow.tenant.in_(tenants), AllocationRow.id != exclude)
        .group_by(AllocationRow.tenant, PoolRow.gpu_product, ClusterRow.region)
    )
    held: dict[str, list[tuple[str, str, int]]] = {}
    for tenant, product, region, gpus in rows:
        held.setdefault(tenant, []).append((product or "", region or "", int(gpus)))
    return {
        tenant: TenantUsage(active=sum(g for *_, g in places), held=tuple(p for p in places if p[0] and p[1]))
        for tenant, places in held.items()
    }


def _named_cohorts(names: Iterable[str | None]) -> list[str]:
    return [name for name in names if name is not None]


# The claims released and their reserved slots freed, in one statement.
_RELEASE = text(
    """
    WITH released AS (
        UPDATE allocation_resource_claims SET released_at = now()
        WHERE allocation_id = :allocation AND released_at IS NULL
          AND (CAST(:attempt AS integer) IS NULL OR attempt = CAST(:attempt AS integer))
        RETURNING slot_id
    ), freed AS (
        UPDATE node_resource_slots SET state = 'available'
        WHERE id IN (SELECT slot_id FROM released) AND state = 'reserved'
    )
    SELECT count(*) FROM released
    """
)


async def release_claims(session: AsyncSession, allocation_id: str, attempt: int | None) -> int:
    """Release the allocation's active claims (of one attempt, or all) and free their reserved slots; how many were
    released. Quarantined slots stay quarantined: only the node agent's confirmed wipe lifts that."""
    return int((await session.execute(_RELEASE, {"allocation": allocation_id, "attempt": attempt})).scalar_one())


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
    """The active allocations of `node` that hold a slot whose GPU its agent judged failed and have not
    been told yet (they are still `active`, not `degraded`): (allocation, what it is told), one per slot."""
    rows = await session.execute(
        select(ClaimRow.allocation_id, SlotRow.slot_index, SlotRow.health_reason, PoolRow.on_gpu_failure)
        .join(SlotRow, SlotRow.id == ClaimRow.slot_id)
        .join(AllocationRow, AllocationRow.id == ClaimRow.allocation_id)
        .join(NodeRow, NodeRow.name == SlotRow.node_id)
        .join(PoolRow, PoolRow.id == NodeRow.pool_id)
        .where(
            SlotRow.node_id == node,
            SlotRow.health == "failed",
            ClaimRow.released_at.is_(None),
            AllocationRow.state == "active",
        )
        .order_by(ClaimRow.allocation_id, SlotRow.slot_index)
    )
    return [
        (allocation, HealthNotice(slot=f"{node}/{index}", reason=reason or "failed", replace=policy == "Replace"))
        for allocation, index, reason, policy in rows
    ]
