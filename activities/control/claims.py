"""Claims: the durable record of which allocation holds which slots, `allocation_resource_claims` (docs/seeds.md,
"Claims recorded durably").

Each activity is one transaction (store/claims.py) and idempotent by (allocation, attempt): a retried activity finds
its own work done and changes nothing. A double claim is impossible at three depths: the scheduler skips claimed
slots, the store's transactions lock and check the slot rows, and the partial unique index refuses a second active
claim outright. A refused claim reaches the workflow as a non-retryable `ClaimConflict` or `QuotaExceeded`.
"""

from __future__ import annotations

from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from contracts.allocation import AdmitResult, ClaimInput, QuarantineInput, ReleaseClaimsInput, SlotsInput
from contracts.failures import CLAIM_CONFLICT, QUOTA_EXCEEDED
from store import claims as store
from store.db import AsyncSession, async_sessionmaker
from store.trail import write_trail, write_trail_in


class QueueWalker(Protocol):
    async def walk(self, regions: list[str] | None) -> AdmitResult: ...


class ClaimActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], queues: QueueWalker | None = None) -> None:
        """`queues`: the admission pass (activities/control/admission.py), run when claims are released or slots
        come back from quarantine; None: no queue is walked (the reconciler's pass still is)."""
        self.sessions = sessions
        self.queues = queues

    @activity.defn(name="record_claims")
    async def record_claims(self, claim: ClaimInput) -> list[int]:
        """Insert the claims and mark the slots reserved, re-checking quota, all in one transaction.

        Raises a non-retryable `ClaimConflict` when another allocation holds any of the slots (the workflow releases
        its lease and moves on) and `QuotaExceeded` when the tenant's quota no longer has room. The trail commits with
        the claims, or on its own after a refusal: the story of a refused claim is kept."""
        try:
            return await store.record_claims(self.sessions, claim)
        except (store.ClaimConflict, store.QuotaExceeded) as refused:
            await write_trail(self.sessions, claim.trail)
            kind = CLAIM_CONFLICT if isinstance(refused, store.ClaimConflict) else QUOTA_EXCEEDED
            # Caused by what caused the refusal (the unique index's IntegrityError, or nothing), as when it was
            # raised here.
            raise ApplicationError(str(refused), type=kind, non_retryable=True) from refused.__cause__

    @activity.defn(name="release_claims")
    async def release_claims(self, request: ReleaseClaimsInput) -> int:
        """Release active claims and free their slots (quarantined slots stay quarantined). Idempotent. The trail is
        written in the same transaction: a final state that rides with the release (a teardown's) is never seen
        while the claims it gave back are still held, nor the claims released under a row that still says
        `releasing`."""
        async with self.sessions.begin() as session:
            await write_trail_in(session, request.trail)
            released = await store.release_claims(session, request.allocation_id, request.attempt)
        if request.walk_region is not None:  # also on a retry that finds the claims released: the pass may not have run
            await self._walk([request.walk_region])
        return released

    @activity.defn(name="quarantine_slots")
    async def quarantine_slots(self, request: QuarantineInput) -> int:
        """The node could not confirm a wipe: keep its slots out of circulation and release the claims."""
        await write_trail(self.sessions, request.trail)
        async with self.sessions.begin() as session:
            return await store.quarantine_slots(
                session, request.allocation_id, request.attempt, request.node, request.slot_indexes, request.reason
            )

    @activity.defn(name="unquarantine_slots")
    async def unquarantine_slots(self, request: SlotsInput) -> int:
        """The node agent confirmed the wipe: the slots may be handed out again."""
        async with self.sessions.begin() as session:
            freed = await store.unquarantine_slots(session, request.node, request.slot_indexes)
        if freed:
            await self._walk(None)
        return freed

    async def _walk(self, regions: list[str] | None) -> None:
        """Offer freed capacity to the queues. A pass that fails here must not fail the release that freed it (the
        release would be retried and the allocation held up): it is logged, and the reconciler's pass, every
        minute, walks every queue."""
        if self.queues is None:
            return
        try:
            await self.queues.walk(regions)
        except Exception:
            activity.logger.warning("admission pass after freeing capacity failed", exc_info=True)

    def activities(self) -> list[object]:
        return [self.record_claims, self.release_claims, self.quarantine_slots, self.unquarantine_slots]
