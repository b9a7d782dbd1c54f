"""The admission pass as the control worker runs it (activities/control/admission.py), on real PostgreSQL:
a burst of releases in one worker makes one pass of the region's queue, not one each queued on its lock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, text

from activities.control.admission import PASS_TIMES, AdmissionActivities
from contracts.allocation import AllocationRecord
from contracts.placement import PlacementRequest
from fleet.loader import load_fleet
from store import queue
from store.apply import apply_fleet
from store.decisions import lock_region
from store.trail import open_row


async def _waiting_for_the_lock(sessions) -> bool:  # type: ignore[no-untyped-def]
    async with sessions() as session:
        waiting = await session.scalar(
            select(func.count()).select_from(text("pg_locks")).where(text("locktype = 'advisory' AND NOT granted"))
        )
    return bool(waiting)


async def test_releases_while_a_pass_waits_for_the_lock_share_it(sessions, temporal_client, examples_dir) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
        request = PlacementRequest(gpu_count=1000, tenant="acme", region="us-east")  # never placed: nobody is woken
        await open_row(
            session,
            AllocationRecord(allocation_id="huge", tenant="acme", request=request, workflow_id="allocation/huge"),
        )
        await session.execute(text("UPDATE allocations SET state = 'queued' WHERE id = 'huge'"))
        await queue.enter(
            session,
            allocation_id="huge",
            tenant="acme",
            region="us-east",
            priority=0,
            priority_class=None,
            request=request.model_dump(mode="json"),
            gpu_count=1000,
            deadline_at=datetime.now(UTC) + timedelta(hours=1),
            reason="",
            code="",
        )
    admission = AdmissionActivities(sessions, temporal_client)
    passes = len(PASS_TIMES.held)

    async with sessions.begin() as holding:  # another decision in the region holds its lock
        await lock_region(holding, "us-east")
        first = asyncio.create_task(admission.walk(["us-east"]))
        while not await _waiting_for_the_lock(sessions):
            await asyncio.sleep(0.01)
        later = [asyncio.create_task(admission.walk(["us-east"])) for _ in range(3)]
        await asyncio.sleep(0)  # they find the pass still waiting and join it
    results = await asyncio.gather(first, *later)

    assert len(PASS_TIMES.held) == passes + 1  # one pass for four releases
    assert [(r.woken, r.waiting) for r in results] == [([], 1)] * 4
    async with sessions() as session:
        entry = await queue.entry(session, "huge")
    assert entry is not None and entry.code == "quota_exceeded"  # the pass judged it, once
    assert (
        entry.reason
        == "quota: tenant acme would exceed its GPU quota: 0 active + 0 in flight + 1000 requested > quota 32"
    )


async def test_a_release_where_nobody_waits_does_not_queue_on_the_regions_lock(
    sessions, temporal_client, examples_dir
) -> None:
    """Most releases free capacity nobody waits for: their pass reads the empty queue without the region's placement
    lock, so it never waits behind the decisions holding it."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    admission = AdmissionActivities(sessions, temporal_client)
    async with sessions.begin() as holding:  # a decision in the region holds its lock throughout
        await lock_region(holding, "us-east")
        result = await asyncio.wait_for(admission.walk(["us-east"]), timeout=10)
        assert (result.woken, result.waiting) == ([], 0)
        assert not await _waiting_for_the_lock(sessions)
