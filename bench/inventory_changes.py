"""Taking in one node's change at 10,000 nodes: the change log against a full reload (target: a change costs one
node's read, not the fleet's).

    python -m bench.inventory_changes [--nodes 10000] [--runs 15]

Starts its own PostgreSQL on loopback, applies a fleet of `--nodes` 8-GPU hosts (`bench.fleets.bench_fleet`),
marks every agent live and every slot valid (in SQL: what 10,000 agents' start reports would leave, without
10,000 reports), and a control worker's `InventoryCache` reads it once. Then, medians over `--runs`:
- full reload: what every change cost before migration 0008 (the inventory and the down set read whole);
- one node's change taken in, per kind: a cordon, an agent's report failing one slot's validation, an agent going
  down (a missed pickup) and back (its heartbeat): the write committed, then the cache's refresh timed;
- the refresh when nothing changed (what every decision pays);
- the triggers' cost on the writes themselves: a claim-shaped UPDATE of 8 slots' `state` and a cordon, with the
  0008 triggers enabled and disabled.
The API holds the same `InventoryCache`, so its cost is the same. It leaves nothing running when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.database import embedded_database
from bench.fleets import bench_fleet
from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.inventory import InventoryCache
from store.liveness import mark_down, record_heartbeats

TRIGGERS_0008 = {
    "nodes": ("nodes_inventory_changes",),
    "node_resource_slots": ("node_resource_slots_changed",),
}


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


async def _write(sessions: async_sessionmaker[AsyncSession], statement: str, **params: object) -> float:
    started = time.perf_counter()
    async with sessions.begin() as session:
        await session.execute(text(statement), params)
    return _ms(started)


async def _everyone_reported(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions.begin() as session:
        await session.execute(
            text(
                "INSERT INTO node_agents (node, state, seen_at, expires_at, interval_seconds, agent_version) "
                "SELECT name, 'live', now(), now() + interval '1 day', 30, 'bench' FROM nodes"
            )
        )
        await session.execute(text("UPDATE node_resource_slots SET validation = 'valid', validated_at = now()"))


async def _take_in(
    sessions: async_sessionmaker[AsyncSession],
    cache: InventoryCache,
    change: Callable[[int], Awaitable[object]],
    i: int,
) -> float:
    reloads, updates = cache.reloads, cache.node_updates
    await change(i)
    async with sessions() as session:
        started = time.perf_counter()
        await cache.inventory(session)
        took = _ms(started)
    if (cache.reloads, cache.node_updates) != (reloads, updates + 1):
        raise AssertionError(f"expected one node update, got reloads {cache.reloads}, updates {cache.node_updates}")
    return took


async def main(nodes: int, runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-inventory-") as home:
        async with embedded_database(Path(home) / "pg", pool_size=5) as database:
            started = time.monotonic()
            async with database.sessions.begin() as session:
                await apply_fleet(session, parse_fleet([("bench.yaml", bench_fleet(nodes))]), prune=True)
            await _everyone_reported(database.sessions)
            print(f"{nodes} hosts applied and reported in {time.monotonic() - started:.0f} s")
            await _measure(database.sessions, nodes, runs)


async def _measure(sessions: async_sessionmaker[AsyncSession], nodes: int, runs: int) -> None:
    full = []
    for _ in range(max(3, runs // 3)):
        fresh = InventoryCache(sweep_every_seconds=3600)
        async with sessions() as session:
            started = time.perf_counter()
            inventory = await fresh.inventory(session)
            full.append(_ms(started))
    slots = len(inventory.slots)
    cache = InventoryCache(sweep_every_seconds=3600)  # sweeps once, on its first read; prunes are not timed here
    async with sessions() as session:
        await cache.inventory(session)

    names = sorted(inventory.snapshot.nodes)

    def node(i: int) -> str:
        return names[(i * 7919) % len(names)]

    async def cordon(i: int) -> None:
        status = "CORDONED" if i % 2 == 0 else "READY"
        await _write(sessions, "UPDATE nodes SET status = :s WHERE name = :n", s=status, n=node(i // 2 * 2))

    async def report(i: int) -> None:
        valid, reason = ("invalid", "gpu_missing") if i % 2 == 0 else ("valid", None)
        await _write(
            sessions,
            "UPDATE node_resource_slots SET validation = :v, validation_reason = :r WHERE node_id = :n AND slot_index = 0",
            v=valid,
            r=reason,
            n=node(i // 2 * 2 + 1),
        )

    async def down_and_up(i: int) -> None:
        async with sessions.begin() as session:
            if i % 2 == 0:
                await mark_down(session, node(i // 2 * 2 + 2), "bench: missed a pickup")
            else:
                await record_heartbeats(session, [(node(i // 2 * 2 + 2), datetime.now(UTC), 30.0)])

    kinds = {"cordon / uncordon": cordon, "agent report (1 slot's validation)": report, "agent down / up": down_and_up}
    taken = {name: [await _take_in(sessions, cache, change, i) for i in range(runs)] for name, change in kinds.items()}
    idle = []
    for _ in range(runs):
        async with sessions() as session:
            started = time.perf_counter()
            await cache.inventory(session)
            idle.append(_ms(started))
    assert cache.reloads == 1, "a one-node change read the whole inventory"

    claim_on, claim_off, cordon_on, cordon_off = [], [], [], []
    for i in range(runs * 2):
        enabled = i % 2 == 0
        await _set_triggers(sessions, enabled)
        ids = f"SELECT id FROM node_resource_slots WHERE node_id = '{node(i + 5)}'"
        claim = await _write(sessions, f"UPDATE node_resource_slots SET state = 'reserved' WHERE id IN ({ids})")
        await _write(sessions, f"UPDATE node_resource_slots SET state = 'available' WHERE id IN ({ids})")
        cordoned = await _write(sessions, "UPDATE nodes SET status = 'CORDONED' WHERE name = :n", n=node(i + 5))
        await _write(sessions, "UPDATE nodes SET status = 'READY' WHERE name = :n", n=node(i + 5))
        (claim_on if enabled else claim_off).append(claim)
        (cordon_on if enabled else cordon_off).append(cordoned)
    await _set_triggers(sessions, True)

    load = os.getloadavg()
    print(f"\n{nodes} nodes / {slots} slots, medians of {runs} (load average {load[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'full reload (before 0008: every change)':52} {statistics.median(full):8.1f} ms")
    for name, samples in taken.items():
        print(f"{'one node taken in: ' + name:52} {statistics.median(samples):8.1f} ms  (max {max(samples):.1f})")
    print(f"{'refresh, nothing changed (every decision)':52} {statistics.median(idle):8.1f} ms")
    print(
        f"{'claim of 8 slots (state), 0008 triggers on/off':52} {statistics.median(claim_on):8.2f} / "
        f"{statistics.median(claim_off):.2f} ms"
    )
    print(
        f"{'cordon write, 0008 trigger on/off':52} {statistics.median(cordon_on):8.2f} / "
        f"{statistics.median(cordon_off):.2f} ms"
    )


async def _set_triggers(sessions: async_sessionmaker[AsyncSession], enabled: bool) -> None:
    verb = "ENABLE" if enabled else "DISABLE"
    async with sessions.begin() as session:
        for table, triggers in TRIGGERS_0008.items():
            for trigger in triggers:
                await session.execute(text(f"ALTER TABLE {table} {verb} TRIGGER {trigger}"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=15)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.nodes, arguments.runs))
