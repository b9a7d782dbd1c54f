"""Pool deadlines in PostgreSQL (migration 0004) and the breaker's read of recent failed attempts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, text

from fleet.loader import parse_fleet
from scheduler.breaker import BreakerPolicy
from store.apply import apply_fleet
from store.models import AllocationEventRow, AllocationRow, PoolRow
from store.snapshot import load_live_state, load_snapshot
from tests.workflows.allocation.test_deadlines_breakers import with_pool_deadlines
from tests.workflows.lab import lab_fleet


async def test_apply_writes_a_pools_deadlines_changes_them_and_snapshots_carry_them(sessions) -> None:
    hosts = {"h1": {"gpus": 2}}
    async with sessions.begin() as session:
        await apply_fleet(
            session, parse_fleet([("f.yaml", with_pool_deadlines(lab_fleet(hosts), {"provisioning": "15m"}))])
        )
    async with sessions() as session:
        assert await session.scalar(select(PoolRow.deadlines)) == {"provisioning": 900.0}
        (pool,) = (await load_snapshot(session)).pools
    assert pool.deadlines == {"provisioning": 900.0}

    edited = with_pool_deadlines(lab_fleet(hosts), {"provisioning": "20m", "releasing": "1h"})
    async with sessions.begin() as session:
        result = await apply_fleet(session, parse_fleet([("f.yaml", edited)]))
    assert [(c.kind, c.name, c.action) for c in result.changes] == [("NodePool", "lab-1/slices", "updated")]
    async with sessions.begin() as session:
        assert await session.scalar(select(PoolRow.deadlines)) == {"provisioning": 1200.0, "releasing": 3600.0}
        await apply_fleet(session, parse_fleet([("f.yaml", lab_fleet(hosts))]))  # deadlines removed: the defaults
    async with sessions() as session:
        assert await session.scalar(select(PoolRow.deadlines)) is None


async def _failed_attempt(session, allocation: str, node: str, reason: str, minutes_ago: float, now: datetime) -> None:
    if await session.get(AllocationRow, allocation) is None:
        session.add(
            AllocationRow(
                id=allocation,
                tenant="acme",
                state="placing",
                shape="gpu_slice",
                gpu_count=1,
                request={},
                workflow_id=f"allocation/{allocation}",
            )
        )
        await session.flush()
    session.add(
        AllocationEventRow(
            allocation_id=allocation,
            event_key=f"run:{node}:{reason}:{minutes_ago}",
            state="placing",
            step="attempt_failed",
            node_id=node,
            reason=reason,
            at=now - timedelta(minutes=minutes_ago),
        )
    )


async def test_only_the_nodes_own_recent_failures_count(sessions) -> None:
    now = datetime.now(UTC)  # the snapshot below judges by the clock: the failures are minutes before the test runs
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("f.yaml", lab_fleet({"h1": {"gpus": 2}, "h2": {"gpus": 2}}))]))
        await _failed_attempt(session, "a1", "h1", "vm_create_failed: simulated", 1, now)
        await _failed_attempt(session, "a2", "h1", "agent_unreachable: gone", 2, now)
        await _failed_attempt(session, "a3", "h1", "deadline_exceeded: provisioning took longer", 3, now)
        await _failed_attempt(session, "a4", "h2", "operator_retry: abandoned by an operator's retry", 1, now)
        await _failed_attempt(session, "a5", "h2", "claim_conflict: slots were claimed concurrently", 1, now)
        await _failed_attempt(session, "a6", "h2", "quota_exceeded: tenant acme holds 8 GPUs", 1, now)
        await _failed_attempt(session, "a7", "h2", "vm_create_failed: long ago", 60, now)
    policy = BreakerPolicy()
    async with sessions() as session:
        live = await load_live_state(session, breaker=policy, now=now)
        snapshot = await load_snapshot(session, breaker=policy)
    assert {node: cooling.failures for node, cooling in live.cooling.items()} == {"h1": 3}
    assert snapshot.nodes["h1"].cooling_off is not None and snapshot.nodes["h1"].cooling_off.failures == 3
    assert snapshot.nodes["h2"].cooling_off is None


async def test_the_breakers_query_reads_the_partial_index(sessions) -> None:
    async with sessions() as session:
        await session.execute(text("SET enable_seqscan = off"))
        plan = "\n".join(
            row[0]
            for row in await session.execute(
                text(
                    "EXPLAIN SELECT node_id, at FROM allocation_events "
                    "WHERE step = 'attempt_failed' AND at > now() - interval '15 minutes'"
                )
            )
        )
    assert "ix_allocation_events_attempt_failed_at" in plan
