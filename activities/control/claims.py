"""Claims: the durable record of which allocation holds which slots (seed 004's allocation_resource_claims).

Each activity is one transaction and idempotent by (allocation, attempt): a retried activity finds its own work done
and changes nothing. A double claim is impossible at three depths: the scheduler skips claimed slots, these
transactions lock and check the slot rows, and the partial unique index refuses a second active claim outright.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.control.records import write_trail
from contracts.allocation import ClaimInput, QuarantineInput, ReleaseClaimsInput, SlotsInput
from store.models import ClaimRow, SlotRow, TenantRow
from store.snapshot import tenant_usage

CLAIM_CONFLICT = "ClaimConflict"
QUOTA_EXCEEDED = "QuotaExceeded"


class ClaimActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    @activity.defn(name="record_claims")
    async def record_claims(self, claim: ClaimInput) -> list[int]:
        """Insert the claims and mark the slots reserved, re-checking quota, all in one transaction.

        Raises a non-retryable `ClaimConflict` when another allocation holds any of the slots (the workflow releases
        its lease and moves on) and `QuotaExceeded` when the tenant's quota no longer has room."""
        await write_trail(self.sessions, claim.trail)
        try:
            async with self.sessions.begin() as session:
                return await self._record(session, claim)
        except IntegrityError as exc:
            raise ApplicationError(
                f"slots on {claim.node} were claimed concurrently by another allocation", type=CLAIM_CONFLICT,
                non_retryable=True,
            ) from exc  # fmt: skip

    async def _record(self, session: AsyncSession, claim: ClaimInput) -> list[int]:
        done = (
            await session.scalars(
                select(ClaimRow.slot_id).where(
                    ClaimRow.allocation_id == claim.allocation_id, ClaimRow.attempt == claim.attempt
                )
            )
        ).all()
        if done:
            return sorted(s for s in done if s is not None)

        # Serialise quota checks per tenant: two allocations of one tenant cannot both take the last headroom.
        tenant = await session.get(TenantRow, claim.tenant, with_for_update=True)
        if tenant is None:
            raise ApplicationError(f"tenant {claim.tenant!r} does not exist", type=QUOTA_EXCEEDED, non_retryable=True)
        active, in_flight = (await tenant_usage(session, exclude_allocation=claim.allocation_id)).get(
            claim.tenant, (0, 0)
        )
        if active + in_flight + claim.gpu_count > tenant.gpu_quota:
            raise ApplicationError(
                f"tenant {claim.tenant} holds {active} GPUs and has {in_flight} in flight; {claim.gpu_count} more would "
                f"exceed its quota of {tenant.gpu_quota}",
                type=QUOTA_EXCEEDED,
                non_retryable=True,
            )

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
            raise ApplicationError(
                f"slots {missing} of {claim.node} are not in the inventory", type=CLAIM_CONFLICT, non_retryable=True
            )
        taken = [s.slot_index for s in slots if s.state != "available"]
        if taken:
            raise ApplicationError(
                f"slots {taken} of {claim.node} are already reserved or quarantined", type=CLAIM_CONFLICT,
                non_retryable=True,
            )  # fmt: skip
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
        await session.flush()
        return [s.id for s in slots]

    @activity.defn(name="release_claims")
    async def release_claims(self, request: ReleaseClaimsInput) -> int:
        """Release active claims and free their slots (quarantined slots stay quarantined). Idempotent."""
        await write_trail(self.sessions, request.trail)
        async with self.sessions.begin() as session:
            query = select(ClaimRow).where(
                ClaimRow.allocation_id == request.allocation_id, ClaimRow.released_at.is_(None)
            )
            if request.attempt is not None:
                query = query.where(ClaimRow.attempt == request.attempt)
            claims = (await session.scalars(query.with_for_update())).all()
            slot_ids = [c.slot_id for c in claims if c.slot_id is not None]
            for claim in claims:
                claim.released_at = func.now()
            if slot_ids:
                await session.execute(
                    update(SlotRow)
                    .where(SlotRow.id.in_(slot_ids), SlotRow.state == "reserved")
                    .values(state="available")
                )
            return len(claims)

    @activity.defn(name="quarantine_slots")
    async def quarantine_slots(self, request: QuarantineInput) -> int:
        """The node could not confirm a wipe: keep its slots out of circulation and release the claims."""
        await write_trail(self.sessions, request.trail)
        async with self.sessions.begin() as session:
            await session.execute(
                update(SlotRow)
                .where(SlotRow.node_id == request.node, SlotRow.slot_index.in_(request.slot_indexes))
                .values(state="quarantined", quarantine_reason=f"{request.allocation_id}: {request.reason}")
            )
            claims = (
                await session.scalars(
                    select(ClaimRow).where(
                        ClaimRow.allocation_id == request.allocation_id,
                        ClaimRow.attempt == request.attempt,
                        ClaimRow.released_at.is_(None),
                    )
                )
            ).all()
            for claim in claims:
                claim.released_at = func.now()
            return len(request.slot_indexes)

    @activity.defn(name="unquarantine_slots")
    async def unquarantine_slots(self, request: SlotsInput) -> int:
        """The node agent confirmed the wipe: the slots may be handed out again."""
        async with self.sessions.begin() as session:
            result = await session.execute(
                update(SlotRow)
                .where(SlotRow.node_id == request.node, SlotRow.slot_index.in_(request.slot_indexes))
                .where(SlotRow.state == "quarantined")
                .values(state="available", quarantine_reason=None)
            )
            return result.rowcount or 0

    def activities(self) -> list[object]:
        return [self.record_claims, self.release_claims, self.quarantine_slots, self.unquarantine_slots]
