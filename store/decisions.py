"""Placement decisions taken one at a time per region, and the tentative choice each leaves for the next.

The control plane reads the inventory, then, holding a transaction-scoped advisory lock for the region, overlays the
plans in progress, ranks, and records its first choice on the allocation's row (`planning` on that node) before
committing. The next decision in the region sees it (`store.snapshot.pending_plans`) and ranks around it.
"""

from __future__ import annotations

import zlib

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import AllocationRow


async def lock_region(session: AsyncSession, region: str) -> None:
    """Wait for the region's decision lock; it is released when the session's transaction ends."""
    await session.execute(select(func.pg_advisory_xact_lock(zlib.crc32(region.encode()))))


async def record_first_choice(session: AsyncSession, allocation_id: str, node: str) -> None:
    await session.execute(
        update(AllocationRow).where(AllocationRow.id == allocation_id).values(state="planning", node_id=node)
    )
