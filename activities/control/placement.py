"""Control-side placement activities: thin adapters that read a current snapshot and ask the pure scheduler.

The snapshot comes from the worker's `InventoryCache`: the inventory is re-read only when the fleet changed, the
claims, slot states, tenant usage, plans in progress and the node breaker's recent failures on every call. The
candidates travel with their pools' deadlines, which the workflow applies from then on."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.contracts import CandidateList, FindCandidatesInput, RegionChoice
from activities.control.records import write_trail
from scheduler import cluster, region
from scheduler.breaker import BreakerPolicy
from scheduler.explanation import Explanation
from store.decisions import lock_region, record_first_choice
from store.inventory import InventoryCache
from store.snapshot import pending_plans, with_pending_plans


class PlacementActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        inventory: InventoryCache | None = None,
        breaker: BreakerPolicy | None = None,
    ) -> None:
        """`breaker`: the node breaker's policy (default: the settings, `BERTH_BREAKER_*`); nodes cooling off are not
        ranked."""
        self.sessions = sessions
        self.inventory = inventory or InventoryCache(breaker=breaker)

    @activity.defn(name="select_region")
    async def select_region(self, request: FindCandidatesInput) -> RegionChoice:
        """Region level of seed 004: tenant policy, quota headroom, region status, product and price."""
        await write_trail(self.sessions, request.trail)
        async with self.sessions() as session:
            snapshot = await self.inventory.snapshot(session, exclude_allocation=request.allocation_id)
        decision = region.select_region(snapshot, request.request)
        if decision.refusal is None:
            return RegionChoice(region=decision.region)  # the explanation travels only with a refusal
        return RegionChoice(
            region=None,
            refusal_code=str(decision.refusal.code),
            refusal_message=decision.refusal.message,
            explanation=Explanation(summary=decision.refusal.message, levels=list(decision.levels)),
        )

    @activity.defn(name="find_candidates")
    async def find_candidates(self, request: FindCandidatesInput) -> CandidateList:
        """Cluster level: pool eligibility and ranked candidate nodes (the chosen one plus alternates).

        Decisions in one region are taken one at a time: each overlays what is being planned right now on the
        inventory and marks its first choice as being planned before the next one looks. Requests that arrive
        together then see each other and spread out, instead of all picking the same best-ranked node and being
        refused there (the node agent stays the authority; this only makes the first choice a good guess). The
        inventory itself is read before taking the lock, so the lock is held for milliseconds even on large fleets."""
        await write_trail(self.sessions, request.trail)
        async with self.sessions() as session:
            base = await self.inventory.snapshot(session, exclude_allocation=request.allocation_id, pending=False)
        async with self.sessions.begin() as session:
            # Under the lock only the cheap part: what was planned since, the ranking, and our tentative choice.
            await lock_region(session, request.region)
            snapshot = with_pending_plans(base, await pending_plans(session, request.allocation_id))
            decision = cluster.find_candidates(snapshot, request.request, request.region)
            if decision.candidates:
                await record_first_choice(session, request.allocation_id, decision.candidates[0].node)
        if decision.refusal is None:
            pools = {pool.key: pool for pool in snapshot.pools}
            deadlines = {c.pool: dict(pools[c.pool].deadlines) for c in decision.candidates if pools[c.pool].deadlines}
            return CandidateList(candidates=decision.candidates, deadlines=deadlines)
        return CandidateList(
            refusal_code=str(decision.refusal.code),
            refusal_message=decision.refusal.message,
            explanation=Explanation(summary=decision.refusal.message, levels=list(decision.levels)),
        )

    def activities(self) -> list[object]:
        return [self.select_region, self.find_candidates]
