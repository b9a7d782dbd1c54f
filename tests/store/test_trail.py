"""The allocation's first trail write against the API's own opening of the same row (`open_row`), both real
PostgreSQL transactions: whichever commits first, the row ends at the workflow's newest state."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import select, text

from contracts.allocation import AllocationRecord, AuditTrail, StateChange
from contracts.placement import PlacementRequest
from fleet.loader import load_fleet
from store.apply import apply_fleet
from store.models import AllocationEventRow, AllocationRow
from store.trail import open_row, write_trail


def _first_trail(allocation_id: str) -> AuditTrail:
    request = PlacementRequest(gpu_count=1, tenant="acme", region="us-east")
    opening = AllocationRecord(allocation_id=allocation_id, tenant="acme", request=request, workflow_id="w")
    change = StateChange(
        allocation_id=allocation_id,
        run_id="r",
        state="placing",
        step="select_region",
        region="us-east",
        at=datetime.now(UTC),
    )
    return AuditTrail(opening=opening, changes=[change])


async def test_the_first_trail_waiting_on_the_apis_uncommitted_row_mirrors_onto_it(sessions, examples_dir) -> None:
    """The API starts the workflow, then writes the row: the workflow's first write can arrive while the API's
    insert is not yet committed. It waits on the key, and must then update the row the API wrote (before: it failed
    with "has no row", and its step was retried a second later)."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    async with sessions() as api:
        async with api.begin():
            opening = _first_trail("a1").opening
            assert opening is not None
            await open_row(api, opening)
            workflow_write = asyncio.create_task(write_trail(sessions, _first_trail("a1")))
            await _blocked_on_a_lock(sessions)  # the workflow's statement waits on the API's uncommitted key
            assert not workflow_write.done()
        await workflow_write
    async with sessions() as session:
        row = await session.get(AllocationRow, "a1")
        assert (row.state, row.region) == ("placing", "us-east")
        events = await session.scalars(select(AllocationEventRow.step).where(AllocationEventRow.allocation_id == "a1"))
        assert list(events) == ["select_region"]


async def _blocked_on_a_lock(sessions) -> None:
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    for _ in range(600):
        async with sessions() as session:
            if await session.scalar(waiting):
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the trail's statement never waited on the API's row")
