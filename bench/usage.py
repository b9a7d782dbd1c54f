"""The usage ledger at a large fleet's size, against a real PostgreSQL started by the benchmark.

    python -m bench.usage [--allocations 1000000] [--tenants 50] [--repeat 5] [--json FILE]

    history    one year of `--allocations` allocations' intervals from `--tenants` tenants (1, 2, 4 or 8 GPUs of
               H100 or H200, in two regions, lasting minutes to a day, exponentially), written straight into the
               ledger (the triggers' output, without a year of claims), plus 500 still held
    report     a monthly report by tenant and product (GET /v1/usage's query, store/usage.report): the last 30 days
               (raw intervals), then the same after everything older than 90 days is rolled up per hour, and a month
               inside the rolled-up year; and the rollup's own time
    claim      the ledger's cost per allocation: `record_claims` and `release_claims` (store/claims.py, the control
               worker's own transactions) for 2-GPU allocations, alternating blocks with the ledger's triggers
               enabled and disabled in the same run; the triggers' own server time and calls from
               pg_stat_user_functions (track_functions = pl)
    pass       one admission pass (`--requests` queued requests over the tenants in a fair-sharing cohort tree,
               bench/cohort_tree.py's), with `usageHalfLife` set against the same tree without it: decayed usage
               read and carried forward (store.usage.with_decayed_usage) plus the pass, in the same run; and the
               first read of a tenant's decayed usage from its whole history (once per tenant and half-life)

Reported: medians of `--repeat` timings, in milliseconds (docs/benchmarks.md, "Usage ledger").
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bench.cohort_tree import fleet_yaml, queued_requests
from bench.database import embedded_database
from contracts.allocation import ClaimInput
from contracts.placement import Bundle
from contracts.vocabulary import QueueingStrategy
from fleet.loader import parse_fleet
from scheduler.admission.admit import admission_pass
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.snapshot import Snapshot
from store import claims, usage
from store.apply import apply_fleet
from store.models import AllocationRow, SlotRow

NOW = datetime(2026, 11, 27, tzinfo=UTC)
HALF_LIFE = "168h"

# One year of intervals in one statement: tenant, product, region, pool, class, shape and GPUs spread evenly, starts
# uniform over the year, lengths exponential with a 3-hour mean (at most a day).
_HISTORY = """
INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpu_product, region, pool, priority_class, shape,
                             node_id, gpus, started_at, ended_at, end_reason)
SELECT 'allocation', 'h-' || i, 1, 't' || lpad((i % :tenants)::text, 2, '0'),
       CASE WHEN i % 3 = 0 THEN 'H200' ELSE 'H100' END, CASE WHEN i % 5 = 0 THEN 'eu' ELSE 'us' END,
       CASE WHEN i % 3 = 0 THEN 'c1/h200' ELSE 'c1/h100' END, CASE WHEN i % 7 = 0 THEN 'batch' END, 'gpu_slice',
       'n' || (i % 64), (ARRAY[1, 2, 4, 8])[1 + i % 4], s, s + least(interval '1 day', e), 'released'
  FROM (SELECT i, CAST(:start AS timestamptz) + random() * interval '365 days' AS s,
               -ln(1 - random()) * interval '3 hours' AS e
          FROM generate_series(1, :count) AS i) AS g
 WHERE s + least(interval '1 day', e) < CAST(:now AS timestamptz)
"""
_OPEN = """
INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpu_product, region, pool, shape, gpus, started_at)
SELECT 'allocation', 'open-' || i, 1, 't' || lpad((i % :tenants)::text, 2, '0'), 'H100', 'us', 'c1/h100',
       'gpu_slice', 2, CAST(:now AS timestamptz) - random() * interval '2 days'
  FROM generate_series(1, 500) AS i
"""


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


async def timed(repeat: int, work: Any) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await work()
        samples.append(time.perf_counter() - started)
    return median_ms(samples)


async def history(sessions: async_sessionmaker[AsyncSession], count: int, tenants: int) -> int:
    start = NOW - timedelta(days=365)
    async with sessions.begin() as session:
        await session.execute(text(_HISTORY), {"tenants": tenants, "start": start, "count": count, "now": NOW})
        await session.execute(text(_OPEN), {"tenants": tenants, "now": NOW})
    async with sessions.begin() as session:  # as autovacuum would, before anything reads them
        await session.execute(text("ANALYZE usage_intervals"))
    async with sessions() as session:
        return int((await session.execute(text("SELECT count(*) FROM usage_intervals"))).scalar_one())


async def reports(sessions: async_sessionmaker[AsyncSession], repeat: int) -> dict[str, Any]:
    month = usage.UsageQuery(NOW - timedelta(days=30), NOW, ("tenant", "product"))
    old_month = usage.UsageQuery(NOW - timedelta(days=200), NOW - timedelta(days=170), ("tenant", "product"))

    async def run(query: usage.UsageQuery) -> int:
        async with sessions() as session:
            return len(await usage.report(session, query, NOW))

    figures: dict[str, Any] = {"groups": await run(month)}
    figures["raw_month_ms"] = await timed(repeat, lambda: run(month))
    figures["raw_old_month_ms"] = await timed(repeat, lambda: run(old_month))
    started, steps = time.perf_counter(), 0
    while True:
        async with sessions.begin() as session:
            moved = await usage.roll_up_step(session, NOW, usage.DEFAULT_RETENTION, timedelta(days=1))
        if moved is None:
            break
        steps += 1
    figures["rollup_s"] = round(time.perf_counter() - started, 1)
    figures["rollup_days"] = steps
    async with sessions.begin() as session:
        await session.execute(text("ANALYZE usage_intervals"))
        await session.execute(text("ANALYZE usage_hourly"))
        counts = await session.execute(
            text("SELECT (SELECT count(*) FROM usage_intervals), (SELECT count(*) FROM usage_hourly)")
        )
        figures["raw_rows_after"], figures["hourly_rows"] = counts.one()
    figures["rolled_month_ms"] = await timed(repeat, lambda: run(month))
    figures["rolled_old_month_ms"] = await timed(repeat, lambda: run(old_month))
    return figures


async def claim_cost(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession], allocations: int
) -> dict[str, Any]:
    """Per allocation: claim and release (two transactions), triggers on and off in alternating blocks of 20."""
    async with sessions() as session:
        slots = await session.scalars(select(SlotRow).where(SlotRow.node_id == "n01").order_by(SlotRow.slot_index))
        bundles = [_bundle(slot) for slot in slots.all()[:2]]
    assert len(bundles) == 2, "the bench fleet's node n01 has no slots"
    times: dict[bool, list[float]] = {True: [], False: []}
    functions: dict[str, tuple[int, float]] = {}
    for block in range(allocations // 20):
        enabled = block % 2 == 0
        async with sessions.begin() as session:
            verb = "ENABLE" if enabled else "DISABLE"
            await session.execute(text(f"ALTER TABLE allocation_resource_claims {verb} TRIGGER usage_open"))
            await session.execute(text(f"ALTER TABLE allocation_resource_claims {verb} TRIGGER usage_close"))
            await session.execute(text(f"ALTER TABLE allocations {verb} TRIGGER usage_final"))
        for k in range(20):
            allocation = f"claim-{block}-{k}"
            async with sessions.begin() as session:
                session.add(
                    AllocationRow(
                        id=allocation,
                        tenant="t00",
                        state="claiming",
                        shape="gpu_slice",
                        gpu_count=2,
                        request={},
                        workflow_id=f"allocation/{allocation}",
                    )
                )
            claim = ClaimInput(
                allocation_id=allocation, attempt=1, node="n01", tenant="t00", gpu_count=2, bundles=bundles
            )
            started = time.perf_counter()
            await claims.record_claims(sessions, claim)
            async with sessions.begin() as session:
                await claims.release_claims(session, allocation, None)
                await session.execute(
                    text("UPDATE allocations SET state = 'released' WHERE id = :id"), {"id": allocation}
                )
            times[enabled].append(time.perf_counter() - started)
    await engine.dispose()  # each backend reports its function statistics when it ends
    async with sessions() as session:
        for name, calls, total in await session.execute(
            text("SELECT funcname, calls, total_time FROM pg_stat_user_functions WHERE funcname LIKE 'usage_%'")
        ):
            functions[name] = (int(calls), float(total))
    async with sessions() as session:
        billed = await session.execute(text("SELECT count(*) FROM usage_intervals WHERE subject LIKE 'claim-%'"))
        assert billed.scalar_one() == len(times[True]), "the ledger billed other than the allocations claimed with it"
    with_ledger = len(times[True])
    per = {
        name: {
            "calls_per_allocation": round(calls / with_ledger, 2),
            "ms_per_allocation": round(total / with_ledger, 3),
        }
        for name, (calls, total) in functions.items()
    }
    return {
        "allocations": allocations,
        "claim_release_ms_with_ledger": median_ms(times[True]),
        "claim_release_ms_without": median_ms(times[False]),
        "client_statements_added": 0,
        "trigger_functions": per,
    }


def _bundle(slot: SlotRow) -> Bundle:
    return Bundle(
        slot_id=f"{slot.node_id}/{slot.slot_index}",
        slot_index=slot.slot_index,
        gpu_pci=slot.gpu_pci_address,
        fabric_parent_pci=slot.fabric_parent_pci_address,
        fabric_vf_pci=slot.fabric_vf_pci_address,
        nvme_device=slot.nvme_device,
        numa_node=slot.numa_node,
        vcpu_count=slot.vcpus,
        memory_mib=slot.memory_mib,
        mac_address=slot.mac_address,
        private_ip=slot.private_ip,
    )


def _without_half_life(snapshot: Snapshot) -> Snapshot:
    plain = copy.copy(snapshot)
    plain.cohorts = {name: dataclasses.replace(view, usage_half_life=None) for name, view in snapshot.cohorts.items()}
    return plain


async def admission(
    sessions: async_sessionmaker[AsyncSession], fleet_text: str, requests: int, tenants: int, repeat: int
) -> dict[str, Any]:
    remembering = snapshot_from_fleet(parse_fleet([("fleet.yaml", fleet_text)]))
    plain = _without_half_life(remembering)
    queue = queued_requests(requests, tenants)
    first_read: list[float] = []
    reads: list[float] = []

    async def one(snapshot: Snapshot, now: datetime) -> None:
        async with sessions.begin() as session:  # the pass's own transaction, as under the region's lock
            await session.execute(text("SELECT pg_advisory_xact_lock(1)"))  # as the pass takes its region's first
            begun = time.perf_counter()
            judged = await usage.with_decayed_usage(session, snapshot, now, fold=True)
            reads.append(time.perf_counter() - begun)
            admission_pass(judged, queue, {}, QueueingStrategy.BEST_EFFORT_FIFO)

    started = time.perf_counter()
    await one(remembering, NOW)  # each tenant's decayed usage from its whole history, carried from here on
    first_read.append(time.perf_counter() - started)
    reads.clear()
    samples: dict[str, list[float]] = {"with": [], "without": []}
    for round_ in range(repeat):
        now = NOW + timedelta(seconds=30 * (round_ + 1))  # a pass every 30 s: every other one carries sums forward
        for name, snapshot in (("without", plain), ("with", remembering)):
            begun = time.perf_counter()
            await one(snapshot, now)
            samples[name].append(time.perf_counter() - begun)
    remembered_reads = reads[1::2]  # the `with` passes' (the others read nothing: no tree remembers)
    return {
        "requests": requests,
        "passes": repeat,
        "pass_ms_without_half_life": median_ms(samples["without"]),
        "pass_ms_with_half_life": median_ms(samples["with"]),
        "decayed_usage_read_ms": median_ms(remembered_reads),
        "decayed_usage_read_max_ms": round(max(remembered_reads) * 1000, 2),
        "first_read_from_history_ms": median_ms(first_read),
    }


def say(figures: dict[str, Any]) -> None:
    print(json.dumps(figures), file=sys.stderr, flush=True)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="berth-usage-") as home:
        async with embedded_database(Path(home) / "data") as database:
            engine, sessions = database.engine, database.sessions
            fleet_text = fleet_yaml("tree-fair", args.tenants, 64, reclaim=False).replace(
                "fairSharing: {enabled: true}", f"fairSharing: {{enabled: true, usageHalfLife: {HALF_LIFE}}}"
            )
            async with sessions.begin() as session:
                await apply_fleet(session, parse_fleet([("fleet.yaml", fleet_text)]))
            async with engine.connect() as connection:  # the triggers' own time, per function
                autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
                await autocommit.execute(text("ALTER SYSTEM SET track_functions = 'pl'"))
                await autocommit.execute(text("SELECT pg_reload_conf()"))
            started = time.perf_counter()
            rows = await history(sessions, args.allocations, args.tenants)
            result: dict[str, Any] = {"intervals": rows, "history_s": round(time.perf_counter() - started, 1)}
            say(result)
            result["claim"] = await claim_cost(engine, sessions, args.claims)
            say(result["claim"])
            result["pass"] = await admission(sessions, fleet_text, args.requests, args.tenants, args.passes)
            say(result["pass"])
            result["report"] = await reports(sessions, args.repeat)
    return result


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allocations", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--passes", type=int, default=21, help="Admission passes of each kind (with, without).")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.claims < 40:
        parser.error("--claims: at least 40 (blocks of 20 allocations, the ledger's triggers on and off in turn)")
    result = asyncio.run(main(args))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    cli()
