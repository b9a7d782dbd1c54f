"""The usage ledger against a real PostgreSQL: intervals of known lengths (claims stamped at known instants, as the
claims table records them) give exact GPU-seconds by every grouping; the rollup keeps every second across a crash;
the reconciler's comparison finds and repairs a ledger that disagrees with the claims."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from fleet.loader import load_fleet
from store import usage
from store.apply import apply_fleet
from store.db import create_engine
from store.migrate import upgrade
from store.models import AllocationEventRow, AllocationRow, ClaimRow, SlotRow, UsageIntervalRow

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)  # a Monday, 08:00 UTC
H = timedelta(hours=1)
POOL = "use1-gpu/h200-slice"


async def _fleet(sessions: async_sessionmaker[AsyncSession], examples_dir) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))


async def hold(
    sessions: async_sessionmaker[AsyncSession],
    allocation: str,
    tenant: str,
    slots: list[int],
    start: datetime,
    end: datetime | None,
    *,
    step: str | None = "release",
    attempt: int = 1,
    node: str = "j22u05",
    priority_class: str | None = None,
    final: str | None = None,
) -> None:
    """An allocation holding `slots` of `node` from `start` to `end` (None: still holding), released after its trail
    recorded `step`, as the workflow's release does."""
    async with sessions.begin() as session:
        if await session.get(AllocationRow, allocation) is None:
            session.add(
                AllocationRow(
                    id=allocation,
                    tenant=tenant,
                    state="active",
                    shape="gpu_slice",
                    gpu_count=len(slots),
                    gpu_product="H200",
                    request={"priority_class": priority_class},
                    workflow_id=f"allocation/{allocation}",
                    region="us-east",
                )
            )
            await session.flush()
        rows = (
            await session.scalars(
                select(SlotRow)
                .where(SlotRow.node_id == node, SlotRow.slot_index.in_(slots))
                .order_by(SlotRow.slot_index)
            )
        ).all()
        session.add_all(
            ClaimRow(allocation_id=allocation, attempt=attempt, slot_id=s.id, node_id=node, bundle={}, claimed_at=start)
            for s in rows
        )
    if end is None:
        return
    async with sessions.begin() as session:
        if step is not None:
            session.add(
                AllocationEventRow(
                    allocation_id=allocation,
                    event_key=f"{step}-{attempt}",
                    at=end,
                    state="releasing",
                    step=step,
                    attempt=attempt,
                )
            )
            await session.flush()
        await session.execute(
            text("UPDATE allocation_resource_claims SET released_at = :end WHERE allocation_id = :id AND attempt = :a"),
            {"end": end, "id": allocation, "a": attempt},
        )
        if final is not None:
            await session.execute(
                text("UPDATE allocations SET state = :s WHERE id = :id"), {"s": final, "id": allocation}
            )


async def _report(sessions, start, end, by=("tenant",), **kwargs) -> list[usage.UsageRow]:
    async with sessions() as session:
        return await usage.report(session, usage.UsageQuery(start, end, tuple(by), **kwargs), now=T0 + 1000 * H)


async def test_known_intervals_give_exact_gpu_seconds_by_every_grouping(sessions, examples_dir) -> None:
    await _fleet(sessions, examples_dir)
    await hold(sessions, "a-1", "acme", [0, 1], T0, T0 + 2 * H)  # 4 GPU-hours
    await hold(sessions, "a-2", "acme", [2], T0 + H, T0 + 4 * H, step="preempt", priority_class="batch")  # 3
    await hold(
        sessions,
        "g-1",
        "globex",
        [3, 4, 5],
        T0 + 30 * timedelta(minutes=1),
        T0 + 90 * timedelta(minutes=1),
        step="expire",
    )  # 3 GPUs for 1 h

    rows = await _report(sessions, T0 - H, T0 + 10 * H)
    by_tenant = {r.group["tenant"]: r for r in rows}
    assert by_tenant["acme"].gpu_seconds == 7 * 3600
    assert by_tenant["acme"].allocations == 2
    assert by_tenant["acme"].peak_gpus == 3  # a-1's two and a-2's one, from T0+1h to T0+2h
    assert by_tenant["globex"].gpu_seconds == 3 * 3600
    assert by_tenant["globex"].peak_gpus == 3

    # By product and pool and class, and clipped to a window: only what falls inside counts.
    rows = await _report(sessions, T0 + H, T0 + 3 * H, by=("product", "pool", "class"))
    assert {(r.group["product"], r.group["pool"], r.group["class"]): r.gpu_seconds for r in rows} == {
        ("H200", POOL, None): 2 * 3600 + 1800 * 3,  # a-1's second hour, globex's last half hour
        ("H200", POOL, "batch"): 2 * 3600,
    }
    # Per-hour buckets, for a chart: each hour's own part, with its own peak.
    hours = await _report(sessions, T0, T0 + 4 * H, by=("tenant",), bucket="hour")
    acme = {r.bucket: (r.gpu_seconds, r.peak_gpus) for r in hours if r.group["tenant"] == "acme"}
    assert acme == {T0: (7200, 2), T0 + H: (10800, 3), T0 + 2 * H: (3600, 1), T0 + 3 * H: (3600, 1)}
    # A tenant's own report holds only its own.
    mine = await _report(sessions, T0 - H, T0 + 10 * H, tenants=frozenset({"globex"}))
    assert [r.group["tenant"] for r in mine] == ["globex"]

    async with sessions() as session:
        reasons = dict((await session.execute(select(UsageIntervalRow.subject, UsageIntervalRow.end_reason))).all())
    assert reasons == {"a-1": "released", "a-2": "preempted", "g-1": "expired"}


async def test_an_interval_ends_for_every_reason_and_an_open_one_counts_until_now(sessions, examples_dir) -> None:
    await _fleet(sessions, examples_dir)
    # A failed create after the claim: the attempt's interval ends, and the next attempt's begins elsewhere.
    await hold(sessions, "r-1", "acme", [0], T0, T0 + timedelta(minutes=5), step="attempt_failed")
    await hold(sessions, "r-1", "acme", [1], T0 + timedelta(minutes=6), T0 + H, step="replace", attempt=2)
    await hold(sessions, "r-1", "acme", [2], T0 + H, None, attempt=3)
    # A cancellation in the middle of an attempt names no ending: the final state does, once it is written.
    await hold(sessions, "c-1", "acme", [3], T0, T0 + timedelta(minutes=2), step="provisioning", final="cancelled")
    async with sessions() as session:
        rows = (
            await session.execute(
                select(
                    UsageIntervalRow.subject,
                    UsageIntervalRow.attempt,
                    UsageIntervalRow.end_reason,
                    UsageIntervalRow.ended_at,
                ).order_by(UsageIntervalRow.subject, UsageIntervalRow.attempt)
            )
        ).all()
        now = T0 + 3 * H
        totals = await usage.report(session, usage.UsageQuery(T0, now + H, ("tenant",)), now=now)
    assert [(s, a, r) for s, a, r, _ in rows] == [
        ("c-1", 1, "cancelled"),
        ("r-1", 1, "attempt_failed"),
        ("r-1", 2, "replaced"),
        ("r-1", 3, None),
    ]
    assert rows[3][3] is None  # still held
    assert totals[0].gpu_seconds == 120 + 300 + 54 * 60 + 2 * 3600  # the open one up to now, no further
    assert totals[0].allocations == 2


async def test_the_counter_reads_the_ledger_and_only_grows(sessions, examples_dir) -> None:
    await _fleet(sessions, examples_dir)
    recent = datetime.now(UTC) - timedelta(minutes=10)
    await hold(sessions, "k-1", "acme", [0, 1], recent, recent + timedelta(minutes=5))
    await hold(sessions, "k-2", "acme", [2], recent, None)
    async with sessions() as session:
        first = await usage.gpu_seconds_totals(session)
    assert [(t, p, r) for t, p, r, _ in first] == [("acme", "H200", "us-east")]
    assert 600 + 600 <= first[0][3] < 600 + 700  # 2 GPUs for 5 minutes, and 1 for the 10 minutes so far
    async with sessions.begin() as session:  # the open one ends: the total keeps what it had
        await session.execute(
            text("UPDATE allocation_resource_claims SET released_at = now() WHERE allocation_id = 'k-2'")
        )
    async with sessions() as session:
        second = await usage.gpu_seconds_totals(session)
    assert second[0][3] >= first[0][3]


async def _rolled(sessions) -> tuple[datetime | None, int, int]:
    async with sessions() as session:
        watermark = await usage.rolled_until(session)
        hourly = (await session.execute(text("SELECT count(*) FROM usage_hourly"))).scalar_one()
        raw = (await session.execute(text("SELECT count(*) FROM usage_intervals"))).scalar_one()
    return watermark, hourly, raw


async def test_the_rollup_keeps_every_second_and_survives_a_kill_in_the_middle(
    sessions, database_url, examples_dir
) -> None:
    await _fleet(sessions, examples_dir)
    now = T0 + 200 * 24 * H
    await hold(sessions, "old-1", "acme", [0, 1], T0, T0 + 3 * H + timedelta(minutes=20))
    await hold(sessions, "old-2", "globex", [2], T0 + 2 * H, T0 + 30 * H)
    await hold(sessions, "new-1", "acme", [3], now - 5 * H, now - H)
    await hold(sessions, "long-1", "acme", [4], T0 + 5 * H, None)  # still held: it straddles every watermark
    window = (T0, now)
    before = {r.group["tenant"]: r.gpu_seconds for r in await _report(sessions, *window)}

    # A rollup killed (kill -9) inside its transaction leaves nothing of itself.
    script = textwrap.dedent(f"""
        import asyncio, sys
        from datetime import datetime, timedelta
        from store.db import create_engine, session_factory
        from store import usage
        async def main():
            engine = create_engine({database_url!r})
            async with session_factory(engine).begin() as session:
                await usage.roll_up_step(session, datetime.fromisoformat({now.isoformat()!r}), timedelta(days=90),
                                         timedelta(days=400))
                print("rolled, not committed", flush=True)
                await asyncio.sleep(600)
        asyncio.run(main())
    """)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, cwd=os.getcwd()
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert line.strip() == b"rolled, not committed"
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert await _rolled(sessions) == (None, 0, 4)

    # Run to the end, a day at a time: the same report, the old intervals gone, the open one kept.
    steps = 0
    while True:
        async with sessions.begin() as session:
            moved = await usage.roll_up_step(session, now, timedelta(days=90), timedelta(days=1))
        if moved is None:
            break
        steps += 1
    watermark, hourly, raw = await _rolled(sessions)
    assert watermark == (now - timedelta(days=90)).replace(minute=0)
    assert raw == 2 and hourly > 0 and steps > 1
    after = {r.group["tenant"]: r.gpu_seconds for r in await _report(sessions, *window)}
    assert after == pytest.approx(before, abs=1e-6)
    # Running it again changes nothing.
    async with sessions.begin() as session:
        assert await usage.roll_up_step(session, now, timedelta(days=90), timedelta(days=1)) is None
    old = await _report(sessions, T0, T0 + 4 * H)
    assert {r.group["tenant"]: (r.gpu_seconds, r.peak_gpus) for r in old} == {
        "acme": (2 * (3 * 3600 + 1200) + 0, 2),
        "globex": (2 * 3600, 1),
    }


async def test_the_reconciler_finds_and_repairs_a_ledger_that_disagrees_with_the_claims(sessions, examples_dir) -> None:
    await _fleet(sessions, examples_dir)
    await hold(sessions, "d-1", "acme", [0, 1], T0, T0 + 2 * H)
    await hold(sessions, "d-2", "acme", [2], T0, T0 + H)
    async with sessions() as session:
        assert await usage.drift(session) == []
        total_before = await usage.gpu_seconds_totals(session)
    async with sessions.begin() as session:  # someone's hand: one interval lost, one cut short
        await session.execute(text("DELETE FROM usage_intervals WHERE subject = 'd-2'"))
        await session.execute(
            text("UPDATE usage_intervals SET ended_at = started_at + interval '1 hour' WHERE subject = 'd-1'")
        )
    async with sessions() as session:
        found = await usage.drift(session)
    assert [(d.allocation_id, d.attempt) for d in found] == [("d-1", 1), ("d-2", 1)]
    assert "no interval" in found[1].message
    async with sessions.begin() as session:
        assert await usage.repair(session, "d-1") == 1
        assert await usage.repair(session, "d-2") == 1
    async with sessions() as session:
        assert await usage.drift(session) == []
        assert await usage.gpu_seconds_totals(session) == total_before
    rows = await _report(sessions, T0, T0 + 3 * H)
    assert rows[0].gpu_seconds == 5 * 3600


async def test_replicas_charge_their_pools_nodes_and_reservations_are_recorded_apart(sessions, examples_dir) -> None:
    """A ModelDeployment replica's engine charges its pool's nodes from its ledger row's insert to its delete, to its
    namespace; a reservation's window is its own kind, cut short when it is cancelled."""
    await _fleet(sessions, examples_dir)
    async with sessions.begin() as session:
        for statement in (
            "INSERT INTO model_deployments (namespace, name, spec, replicas, status) VALUES ('prod', 'llama', '{}', 1, '{}')",
            "INSERT INTO model_replicas (namespace, name, deployment, cluster, replica_index, spec, state) "
            "SELECT 'prod', 'llama-0', 'llama', cluster, 0, '{}', 'ready' FROM pools WHERE name = 'h200-slice'",
            "INSERT INTO replica_pool_usage (namespace, replica, engine, pool_id, nodes) "
            "SELECT 'prod', 'llama-0', 'serve', id, 2 FROM pools WHERE name = 'h200-slice'",
        ):
            await session.execute(text(statement))
        await session.execute(
            text(
                "INSERT INTO reservations (id, tenant, region, node_id, gpu_count, gpu_product, shape, starts_at, "
                "ends_at, state) VALUES ('r-1', 'acme', 'us-east', 'j22u05', 4, 'H200', 'gpu_slice', :s, :e, "
                "'reserved')"
            ),
            {"s": T0, "e": T0 + 10 * H},
        )
    async with sessions.begin() as session:
        await session.execute(text("DELETE FROM model_replicas WHERE name = 'llama-0'"))  # its ledger rows go too
        await session.execute(text("UPDATE reservations SET state = 'cancelled' WHERE id = 'r-1'"))
    async with sessions() as session:
        rows = {
            kind: (tenant, nodes, gpus, end_reason, ended is not None)
            for kind, tenant, nodes, gpus, end_reason, ended in await session.execute(
                select(
                    UsageIntervalRow.kind,
                    UsageIntervalRow.tenant,
                    UsageIntervalRow.nodes,
                    UsageIntervalRow.gpus,
                    UsageIntervalRow.end_reason,
                    UsageIntervalRow.ended_at,
                )
            )
        }
    assert rows == {
        "replica": ("namespace:prod", 2, 0, "released", True),
        "reservation": ("acme", 0, 4, "cancelled", True),
    }
    report = await _report(sessions, T0, T0 + 10 * H, by=("tenant",))
    acme = next(r for r in report if r.group["tenant"] == "acme")
    assert (acme.gpu_seconds, acme.reserved_gpu_seconds) == (0, 4 * 10 * 3600)  # cancelled after its window: whole


async def test_decayed_usage_carried_forward_is_what_the_whole_history_sums_to(sessions, examples_dir) -> None:
    """The admission pass's sums, carried forward a minute at a time, against PostgreSQL's sum over the whole
    history at the same instant (a half-life no sum was carried for)."""
    await _fleet(sessions, examples_dir)
    now = T0 + 10 * 24 * H
    await hold(sessions, "u-1", "acme", [0, 1], now - 3 * 24 * H, now - 2 * 24 * H)
    await hold(sessions, "u-2", "acme", [2], now - 5 * H, None)
    await hold(sessions, "u-3", "globex", [3], now - 30 * H, now - 29 * H)
    day = 86400.0
    async with sessions.begin() as session:
        first = await usage.decayed_usage(session, {"acme": day, "globex": day}, now, fold=True)
    await hold(sessions, "u-4", "globex", [4], now + timedelta(seconds=30), now + timedelta(seconds=90))
    later = now + timedelta(minutes=6)
    async with sessions.begin() as session:
        carried = await usage.decayed_usage(session, {"acme": day, "globex": day}, later, fold=True)
        rows = (await session.execute(text("SELECT tenant, as_of FROM usage_decay ORDER BY tenant"))).all()
    assert rows == [("acme", later), ("globex", later)]
    async with sessions() as session:  # another half-life: summed from the whole history, nothing carried
        whole = await usage.decayed_usage(session, {"acme": day + 1e-9, "globex": day + 1e-9}, later, fold=False)
    assert carried == pytest.approx(whole, rel=1e-6)
    assert carried["globex"] > first["globex"] * 0.5  # u-4's minute counts
    # 2 GPUs for a day, two days ago, and one GPU for the last 5 hours, by the formula (GPU-seconds):
    expected = 2 * day / math.log(2) * (2**-2 - 2**-3) + day / math.log(2) * (1 - 2 ** (-5 / 24))
    assert first["acme"] == pytest.approx(expected, rel=1e-9)


async def test_claims_recorded_before_the_ledger_existed_are_billed_by_its_migration(empty_database_url: str) -> None:
    """An installation upgraded to the ledger keeps its history: every attempt's claims become an interval, the
    attempts before the last `attempt_failed`, the last one its allocation's final state, and the totals follow."""
    engine = create_engine(empty_database_url)
    try:
        await upgrade(engine, "0020")
        async with engine.begin() as connection:
            await connection.execute(text("INSERT INTO tenants (name, gpu_quota) VALUES ('acme', 8)"))
            await connection.execute(
                text(
                    "INSERT INTO allocations (id, tenant, state, shape, gpu_count, request, workflow_id) VALUES "
                    "('old', 'acme', 'released', 'gpu_slice', 2, '{\"priority_class\": \"batch\"}', 'allocation/old')"
                )
            )
            await connection.execute(
                text(
                    "INSERT INTO allocation_resource_claims (allocation_id, attempt, slot_id, node_id, bundle, claimed_at, "
                    "released_at) SELECT 'old', a, NULL, 'n' || a, '{}', CAST(:t AS timestamptz) + (a - 1) * interval '1 hour', "
                    "CAST(:t AS timestamptz) + a * interval '1 hour' FROM generate_series(1, 2) AS a, generate_series(1, 2) AS gpu"
                ),
                {"t": T0},
            )
        await upgrade(engine)
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    text(
                        "SELECT attempt, gpus, priority_class, started_at, ended_at, end_reason, first FROM usage_intervals "
                        "ORDER BY attempt"
                    )
                )
            ).all()
            totals = (await connection.execute(text("SELECT tenant, gpu_seconds FROM usage_totals"))).all()
    finally:
        await engine.dispose()
    assert rows == [
        (1, 2, "batch", T0, T0 + H, "attempt_failed", True),
        (2, 2, "batch", T0 + H, T0 + 2 * H, "released", False),
    ]
    assert totals == [("acme", 4 * 3600.0)]
