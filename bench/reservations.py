"""Reservation starts and ends under load: how late a reservation becomes its allocation after its start,
and how late that allocation expires after its end, while a churn of other allocations is placed and released, with
the churn's own create -> active measured in the same run as the baseline (the placement path without a timer).

    python -m bench.reservations [--reservations 8] [--churn 8]

The fleet has 2 x R nodes of 8 GPUs. R reservations of 8 GPUs, one per node of the first half, start one second
apart, 20 s after they were made, and last 20 s; C loops meanwhile create a 2-GPU allocation with no end, wait until
it is active, release it and start again (the reservations' holds keep them on the other half). Each reservation is
made as the API makes one (its row, then its workflow, `workflows.reservation.client`); the control worker runs in
this process, the simulated hosts' agents in another, through the node gateway, as `bench.allocation` runs them.

Reported, p50 and p99, wall clock on this machine (PostgreSQL, Temporal and this process share its clock):

- start -> started: the reservation's start to its allocation's first event (the timer fired, `start_reservation`
  recorded the allocation, its child workflow began);
- start -> active: to its allocation's `ready` event, its VM up on the node (the target: under 2 s);
- end -> expired: the window's end to the allocation's `expired` event (the release saga done);
- baseline: a churn allocation's create -> its `ready` event, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.polling import settled, until
from bench.rows import step_times
from bench.stack import FAST, Request, Stack, release, run_workers, start
from bench.stats import print_figures
from contracts.placement import PlacementRequest
from contracts.task_queues import Queues
from store import reservations
from store.models import ReservationRow
from workflows.reservation.client import start_reservation

LEAD_S = 20.0  # from the reservation's creation to its start
LENGTH_S = 20.0


async def _churn(stack: Stack, queues: Queues, stop: asyncio.Event, created: dict[str, float]) -> None:
    """Create, wait until active, release, wait until released; again until `stop`."""
    while not stop.is_set():
        request = Request(f"churn-{uuid.uuid4().hex[:8]}", "bench", 2)
        created[request.allocation_id] = time.time()
        await start(stack, queues, request)
        await settled(stack.sessions, [request.allocation_id], ("active",), every=0.2, timeout=120, what="churn placed")
        await release(stack, request.allocation_id)
        await settled(
            stack.sessions, [request.allocation_id], ("released",), every=0.2, timeout=120, what="churn released"
        )


async def _reserve(stack: Stack, queues: Queues, node: str, starts: datetime) -> str:
    reservation_id = f"r-{uuid.uuid4().hex[:8]}"
    ends = starts + timedelta(seconds=LENGTH_S)
    async with stack.sessions.begin() as session:
        await reservations.create(
            session,
            ReservationRow(
                id=reservation_id,
                tenant="bench",
                region="bench",
                node_id=node,
                gpu_count=8,
                gpu_product=None,
                shape="gpu_slice",
                starts_at=starts,
                ends_at=ends,
                state="reserved",
            ),
        )
    request = PlacementRequest(gpu_count=8, tenant="bench", region="bench")
    await start_reservation(stack.client, reservation_id, "bench", node, request, starts, ends, FAST, queues)
    return reservation_id


async def _allocations_of(stack: Stack, ids: list[str], limit: float) -> dict[str, tuple[str, datetime, datetime]]:
    """reservation -> (its allocation, start, end), once every one has ended."""
    rows: list[Any] = []

    async def ended() -> bool:
        nonlocal rows
        async with stack.sessions() as session:
            rows = list(
                await session.execute(
                    text(
                        "SELECT id, allocation_id, starts_at, ends_at, state, reason FROM reservations WHERE id = ANY(:ids)"
                    ),
                    {"ids": ids},
                )
            )
        if any(state == "failed" for *_, state, _ in rows):
            raise RuntimeError(f"a reservation failed: {await not_ended()}")
        return bool(rows) and all(state == "ended" for *_, state, _ in rows)

    async def not_ended() -> str:
        """Each reservation not ended: its state, why, and why its allocation failed (if it did)."""
        async with stack.sessions() as session:
            failures = dict(
                (
                    await session.execute(
                        text("SELECT id, failure_reason FROM allocations WHERE id = ANY(:ids)"),
                        {"ids": [a for _, a, *_ in rows if a]},
                    )
                ).all()
            )
        return f"{[(r, st, why, failures.get(a)) for r, a, _, _, st, why in rows if st != 'ended']}"

    await until(ended, every=0.5, timeout=limit, what="every reservation ending", detail=not_ended)
    return {r: (a, s, e) for r, a, s, e, _, _ in rows}


async def run(stack: Stack, count: int, churners: int) -> dict[str, list[float]]:
    path = await stack.load_fleet(2 * count)
    queues = Queues(control="reserve.control", node_prefix="reserve.node.")
    await run_workers(stack, path, queues)
    stop, created = asyncio.Event(), {}
    first = datetime.now(UTC) + timedelta(seconds=LEAD_S)
    async with stack.sessions() as session:
        nodes = sorted((await session.execute(text("SELECT name FROM nodes"))).scalars())[:count]
    ids = [await _reserve(stack, queues, node, first + timedelta(seconds=i)) for i, node in enumerate(nodes)]
    loops = [asyncio.create_task(_churn(stack, queues, stop, created)) for _ in range(churners)]
    try:
        placed = await _allocations_of(stack, ids, LEAD_S + count + LENGTH_S + 120)
    finally:
        stop.set()
        for loop in loops:
            with contextlib.suppress(Exception):
                await loop
    allocations = [a for a, _, _ in placed.values()]
    events = await step_times(stack.sessions, ids=allocations + list(created))
    started, active, expired = [], [], []
    for allocation, starts, ends in placed.values():
        steps = events[allocation]
        started.append(min(steps.values()) - starts.timestamp())  # its first event, whichever step
        active.append(steps["ready"] - starts.timestamp())
        expired.append(steps["expired"] - ends.timestamp())
    baseline = [events[a]["ready"] - at for a, at in created.items() if "ready" in events.get(a, {})]
    return {"started": started, "active": active, "expired": expired, "baseline": baseline}


def report(figures: dict[str, list[float]], count: int, churners: int) -> None:
    print(f"reservations, {count} of 8 GPUs one second apart, {churners} churning allocations (ms, p50 / p99):")
    names = {
        "started": "start -> its allocation's first event",
        "active": "start -> its allocation active (ready)",
        "expired": "end -> its allocation expired",
        "baseline": "baseline: a churn allocation's create -> active",
    }
    print_figures(figures, names, 50)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as home:
        stack = Stack(Path(home))
        try:
            await stack.connect()
            report(await run(stack, args.reservations, args.churn), args.reservations, args.churn)
        finally:
            await stack.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reservations", type=int, default=8, help="reservations, each on a node of its own")
    parser.add_argument("--churn", type=int, default=8, help="allocations created and released in a loop meanwhile")
    asyncio.run(main(parser.parse_args()))
