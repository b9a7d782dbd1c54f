"""Placement decisions taken one at a time per region, and the tentative choice each leaves for the next.

The control plane reads the inventory and the plans in progress, and ranks, without any lock. It then records its first
choice (`planning` on that node) in one statement, `berth_record_first_choice` (migration 0018): under the region's
transaction-scoped advisory lock, the function checks that what allocations the ranking did not see on the chosen node
have taken there since (planned, set aside, claimed) still leaves room for this request, and only then writes the
choice. If it does not (other decisions filled the node meanwhile), nothing is written and the caller reads and ranks
again. What ended since (released, given up) only left the node more room, and does not count. The next decision in the
region sees a recorded choice (the plans in `store.snapshot.load_live_state`) and ranks around it.

The lock is held inside the database for the function's work alone: no round trip of the control worker, and no
wait for its event loop, falls inside it. Decisions that cannot fit anyway never take it. Other region-wide steps
(admission passes, reservations, the API's queue view) take the same lock for their transaction (`lock_region`).
"""

from __future__ import annotations

import zlib
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.types import String

from store.snapshot import PLANNING_STATES


def _lock_key(region: str) -> int:
    return zlib.crc32(region.encode())


async def lock_region(session: AsyncSession, region: str) -> None:
    """Wait for the region's decision lock; it is released when the session's transaction ends."""
    await session.execute(select(func.pg_advisory_xact_lock(_lock_key(region))))


@dataclass(frozen=True)
class Recorded:
    """What `record_first_choice` did: whether it wrote the choice, and the region lock's times, measured by the
    database (the wait for the lock, and the hold up to the function's end; the statement's commit follows)."""

    recorded: bool
    waited_ms: float
    held_ms: float


_RECORD = text(
    "SELECT berth_record_first_choice(:key, :allocation, :node, :seen, :spare, :states, :leave_queue)"
).bindparams(bindparam("seen", type_=ARRAY(String)), bindparam("states", type_=ARRAY(String)))


async def record_first_choice(
    sessions: async_sessionmaker[AsyncSession],
    region: str,
    allocation_id: str,
    node: str,
    seen: Collection[str] | None,
    spare: int = 0,
    leave_queue: bool = False,
) -> Recorded:
    """Record `node` as the allocation's first choice, unless allocations not among `seen` (those the ranking saw
    holding or planning GPUs there) have taken more than `spare` GPUs there since (what the ranking saw free there
    beyond this request's own); `seen=None` records without looking. `leave_queue`: a queued request placed at last
    leaves its queue in the same statement.

    One statement in its own transaction (autocommit): the region's lock is taken and released around the
    function's work, with the commit."""
    async with sessions() as session:
        await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        outcome = await session.scalar(
            _RECORD,
            {
                "key": _lock_key(region),
                "allocation": allocation_id,
                "node": node,
                "seen": None if seen is None else sorted(seen),
                "spare": spare,
                "states": list(PLANNING_STATES),
                "leave_queue": leave_queue,
            },
        )
    return Recorded(recorded=outcome["recorded"], waited_ms=outcome["waited_ms"], held_ms=outcome["held_ms"])
