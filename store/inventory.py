"""A control worker's copy of the placement inventory, kept between requests.

Reading the whole inventory costs about a millisecond per ten nodes (80,000 slot rows at 10,000 nodes take over a
second), yet it changes only when an operator or an agent changes the fleet, and then mostly one node at a time.
The cache keeps it and asks PostgreSQL one question per decision (one statement, one snapshot): has
`inventory_version` moved, and which nodes are in the change log since my position? Triggers write both
(migrations 0002 and 0008): the version moves for fleet-level changes (regions, classes, clusters, pools, tenants; a
node added, removed or moved between pools), the log names the node for a cordon, a slot's approval or validation,
or its agent going live or down. Only the logged nodes are re-read (`store.snapshot.load_nodes`) and laid over the
kept inventory (`Snapshot.with_nodes` re-groups only their pools). What moves with every allocation, claims,
reserved and quarantined slots, tenant usage and the plans in progress, is read fresh each time and laid over it
(`store.snapshot.overlay`: only the nodes whose claims, quarantines or cool-off moved since the
last decision are rebuilt).

    read (version, xmin, pruned-through, logged nodes) -> version moved, log pruned past us, or too many nodes?
        -> reload whole | re-read the logged nodes -> read live state -> overlay -> Snapshot

The position is a transaction id, not the log's `seq` (see migration 0008): rows from transactions below the last
snapshot's xmin have all been seen; rows at or above it are re-read until the xmin passes them (`_applied` skips
those already taken in).

The live state includes the node breaker's recent failed attempts (`scheduler.breaker`, settings
`BERTH_BREAKER_*`): one range scan of a partial index, so nodes whose attempts keep failing sit out their cool-off.

Agent liveness travels through the same log: heartbeats that leave an agent live write nothing, a state change
logs its node. Every few seconds the cache also expires agents that stopped reporting (one indexed UPDATE that
usually touches nothing) and prunes log rows older than `keep_changes_seconds`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from config.settings import get_settings
from scheduler.breaker import BreakerPolicy
from scheduler.snapshot import Snapshot
from store.liveness import expire_stale, load_liveness
from store.snapshot import (
    Inventory,
    LiveState,
    Overlay,
    load_inventory,
    load_live_state,
    load_nodes,
    overlay,
    with_changed_nodes,
    with_liveness,
    with_usage,
)

SWEEP_EVERY_SECONDS = 5.0
KEEP_CHANGES_SECONDS = 600.0  # the change log's retention: a cache idle for longer reads the inventory whole
MAX_NODES_PER_UPDATE = 1_000  # more changed nodes than this at once (an apply): one full read is cheaper

# One statement, so the version, the xmin and the log rows come from one snapshot: a logged change whose
# transaction also moved the version is never seen without the version.
_CHANGES = text(
    "SELECT v.version, x.xmin, p.through, c.seq, c.node, c.txid FROM inventory_version AS v "
    "CROSS JOIN (SELECT CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint) AS xmin) AS x "
    "CROSS JOIN inventory_changes_pruned AS p "
    "LEFT JOIN inventory_changes AS c ON c.txid >= :position AND c.txid < :position + 1099511627776 ORDER BY c.seq"
)  # the upper bound is never reached; it makes the prepared statement's generic plan an index range scan
# Only rows every transaction that could still be reading them has passed: a reader kept below them (by a long
# transaction anywhere) is kept below the prune too, and only a reader that stopped reading for the retention
# period falls behind it.
_PRUNE = text(
    "WITH gone AS (DELETE FROM inventory_changes WHERE at < now() - make_interval(secs => :keep) "
    "AND txid < CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint) RETURNING txid) "
    "UPDATE inventory_changes_pruned SET through = greatest(through, (SELECT max(txid) FROM gone)) "
    "WHERE id = 1 AND EXISTS (SELECT 1 FROM gone)"
)
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
    """One per worker or API process. Safe for concurrent activities: one refresh at a time, the others wait for it
    and find nothing left to do."""

    def __init__(
        self,
        sweep_every_seconds: float = SWEEP_EVERY_SECONDS,
        breaker: BreakerPolicy | None = None,
        *,
        keep_changes_seconds: float = KEEP_CHANGES_SECONDS,
        max_nodes_per_update: int = MAX_NODES_PER_UPDATE,
    ) -> None:
        self.breaker = breaker or breaker_policy()
        self._inventory: Inventory | None = None  # with agent liveness applied
        self._overlay: Overlay | None = None  # the last decision's claims and cool-offs laid over `_inventory`
        self._position = 0  # every logged change from a transaction below this id has been taken in
        self._applied: set[int] = set()  # log rows at or above the position already taken in
        self._refreshing = asyncio.Lock()
        self._sweep_every = sweep_every_seconds
        self._keep_changes = keep_changes_seconds
        self._max_nodes = max_nodes_per_update
        self._swept_at = float("-inf")
        self.reloads = 0  # how often the inventory was read whole (for tests and benchmarks)
        self.node_updates = 0  # how often only logged nodes were re-read
        self.nodes_reread = 0  # how many nodes those re-reads took in, in all

    async def snapshot(
        self, session: AsyncSession, exclude_allocation: str | None = None, *, pending: bool = True
    ) -> Snapshot:
        """The same snapshot `store.snapshot.load_snapshot` would build, from the kept inventory when it is current."""
        inventory = await self.inventory(session)
        live = await load_live_state(session, exclude_allocation, pending=pending, breaker=self.breaker)
        return with_usage(self._overlaid(inventory, live), live)

    async def snapshot_and_plans(
        self, session: AsyncSession, exclude_allocation: str | None = None
    ) -> tuple[Snapshot, dict[str, list[tuple[str, int]]]]:
        """The snapshot without the plans in progress, and those plans, from one read: for a caller that lays the
        plans over it itself and re-reads them under the region's lock (`activities.control.placement`)."""
        inventory = await self.inventory(session)
        live = await load_live_state(session, exclude_allocation, pending=True, breaker=self.breaker)
        return with_usage(self._overlaid(inventory, live), dataclasses.replace(live, plans={})), live.plans

    def _overlaid(self, inventory: Inventory, live: LiveState) -> Snapshot:
        """The live state laid over the inventory, rebuilding only the nodes that moved since the last decision."""
        self._overlay = overlay(inventory, live, self._overlay)
        return self._overlay.snapshot

    async def inventory(self, session: AsyncSession) -> Inventory:
        """The inventory with agent liveness applied: read whole the first time and after fleet-level changes,
        otherwise only the nodes the change log names."""
        await self._sweep(session)
        async with self._refreshing:
            rows = (await session.execute(_CHANGES, {"position": self._position})).all()
            version, xmin, pruned = (int(v) for v in rows[0][:3])
            logged = [(int(seq), node, int(txid)) for _, _, _, seq, node, txid in rows if seq is not None]
            fresh = [(seq, node) for seq, node, _ in logged if seq not in self._applied]
            if self._needs_full_read(version, pruned, fresh) or not await self._take_in(session, fresh):
                self._inventory = with_liveness(await load_inventory(session), await load_liveness(session))
                self.reloads += 1
            self._position = max(self._position, xmin)
            self._applied = {seq for seq, _, txid in logged if txid >= self._position}
            assert self._inventory is not None
            return self._inventory

    def _needs_full_read(self, version: int, pruned: int, fresh: list[tuple[int, str]]) -> bool:
        return (
            self._inventory is None
            or self._inventory.version < version
            or pruned >= self._position
            or len({node for _, node in fresh}) > self._max_nodes
        )

    async def _take_in(self, session: AsyncSession, fresh: list[tuple[int, str]]) -> bool:
        """Re-read the logged nodes and lay them over the kept inventory. False when they cannot be laid over (a
        node added, removed or moved since, or a fleet change in between): the caller reads the whole inventory."""
        assert self._inventory is not None
        if not fresh:
            return True
        names = {node for _, node in fresh}
        changes = await load_nodes(session, names)
        known = self._inventory.snapshot.nodes
        if changes.version != self._inventory.version or changes.nodes.keys() != names or not names <= known.keys():
            return False
        self._inventory = with_changed_nodes(self._inventory, changes)
        self.node_updates += 1
        self.nodes_reread += len(names)
        return True

    async def _sweep(self, session: AsyncSession) -> None:
        """Expire agents that stopped reporting and prune the change log, at most every few seconds per process. It
        commits on its own: the caller's transaction may be read-only or rolled back."""
        if time.monotonic() - self._swept_at < self._sweep_every:
            return
        self._swept_at = time.monotonic()
        try:
            async with AsyncSession(session.bind) as own, own.begin():
                await expire_stale(own)
            async with AsyncSession(session.bind) as own, own.begin():
                await own.execute(_PRUNE, {"keep": self._keep_changes})
        except Exception:  # noqa: BLE001 - a failed sweep must not fail the decision; the next one retries
            log.warning("could not expire silent node agents or prune the change log; retrying later", exc_info=True)
