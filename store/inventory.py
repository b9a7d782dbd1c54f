"""A control worker's copy of the placement inventory, kept between requests.

Reading the whole inventory costs about a millisecond per ten nodes (80,000 slot rows at 10,000 nodes take over a
second), yet it changes only when an operator changes the fleet. The cache keeps it and asks PostgreSQL one
question per decision: has `inventory_version` moved? (Database triggers move it on every inventory write, see
migration 0002.) What moves with every allocation, claims, reserved and quarantined slots, tenant usage and the
plans in progress, is read fresh each time and laid over the kept inventory (`store.snapshot.current_snapshot`).

    read versions -> (inventory moved? reload it) -> (liveness moved? re-read the down set) -> read live state
                  -> overlay -> Snapshot

The live state includes the node breaker's recent failed attempts (`scheduler.breaker`, settings
`BERTH_BREAKER_*`): one range scan of a partial index, so nodes whose attempts keep failing sit out their cool-off.

Agent liveness is a layer of its own (`store.liveness`): heartbeats never move the inventory version, and the set
of nodes without a live agent is re-read only when an agent went live or down. Every few seconds the cache also
expires agents that stopped reporting (one indexed UPDATE that usually touches nothing).
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from config.settings import get_settings
from scheduler.breaker import BreakerPolicy
from scheduler.snapshot import Snapshot
from store.liveness import Liveness, expire_stale, load_liveness
from store.models import InventoryVersionRow, LivenessVersionRow
from store.snapshot import Inventory, current_snapshot, load_inventory, load_live_state, with_liveness

SWEEP_EVERY_SECONDS = 5.0
log = logging.getLogger("berth.control")


def breaker_policy() -> BreakerPolicy:
    """The node breaker as the settings give it (`BERTH_BREAKER_*`)."""
    settings = get_settings()
    return BreakerPolicy(
        threshold=settings.breaker_failures,
        window_seconds=settings.breaker_window_seconds,
        cooloff_seconds=settings.breaker_cooloff_seconds,
    )


class InventoryCache:
    """One per worker process. Safe for concurrent activities: a reload happens once, the others wait for it."""

    def __init__(self, sweep_every_seconds: float = SWEEP_EVERY_SECONDS, breaker: BreakerPolicy | None = None) -> None:
        self.breaker = breaker or breaker_policy()
        self._inventory: Inventory | None = None
        self._liveness: Liveness | None = None
        self._live_inventory: Inventory | None = None  # `_inventory` with `_liveness` applied
        self._reloading = asyncio.Lock()
        self._sweep_every = sweep_every_seconds
        self._swept_at = float("-inf")
        self.reloads = 0  # how often the inventory was read whole (for tests and benchmarks)

    async def snapshot(
        self, session: AsyncSession, exclude_allocation: str | None = None, *, pending: bool = True
    ) -> Snapshot:
        """The same snapshot `store.snapshot.load_snapshot` would build, from the kept inventory when it is current."""
        inventory = await self.inventory(session)
        live = await load_live_state(session, exclude_allocation, pending=pending, breaker=self.breaker)
        return current_snapshot(inventory, live)

    async def inventory(self, session: AsyncSession) -> Inventory:
        """The inventory with agent liveness applied, re-read only in the parts whose version moved."""
        await self._sweep(session)
        both = select(
            select(InventoryVersionRow.version).scalar_subquery(), select(LivenessVersionRow.version).scalar_subquery()
        )
        row = (await session.execute(both)).one()
        version, live_version = int(row[0]), int(row[1])
        if self._stale(version, live_version):
            async with self._reloading:
                if self._inventory is None or self._inventory.version < version:
                    self._inventory = await load_inventory(session)
                    self._live_inventory = None
                    self.reloads += 1
                if self._liveness is None or self._liveness.version < live_version:
                    self._liveness = await load_liveness(session)
                    self._live_inventory = None
                if self._live_inventory is None:
                    assert self._inventory is not None and self._liveness is not None
                    self._live_inventory = with_liveness(self._inventory, self._liveness)
        assert self._live_inventory is not None
        return self._live_inventory

    def _stale(self, version: int, live_version: int) -> bool:
        return (
            self._live_inventory is None
            or self._inventory is None
            or self._inventory.version < version
            or self._liveness is None
            or self._liveness.version < live_version
        )

    async def _sweep(self, session: AsyncSession) -> None:
        """Expire agents that stopped reporting, at most every few seconds per process. It commits on its own: the
        caller's transaction may be read-only or rolled back."""
        if time.monotonic() - self._swept_at < self._sweep_every:
            return
        self._swept_at = time.monotonic()
        try:
            async with AsyncSession(session.bind) as own, own.begin():
                await expire_stale(own)
        except Exception:  # noqa: BLE001 - a failed sweep must not fail the decision; the next one retries
            log.warning("could not expire silent node agents; retrying at the next decision", exc_info=True)
