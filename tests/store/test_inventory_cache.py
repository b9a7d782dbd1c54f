"""The control worker's inventory cache: always the snapshot a full read would give, re-reading the inventory only
when the fleet changed (database triggers move the version; claims and slot states do not)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import select, text, update

from contracts.vocabulary import SlotState
from devstack.reports import report_hosts, simulated_report
from fleet.loader import load_fleet
from scheduler.host.checks import ValidationState
from store import snapshot as snapshot_module
from store.apply import apply_fleet
from store.inventory import _PRUNE, InventoryCache
from store.liveness import mark_down, record_heartbeats
from store.models import AllocationRow, ClaimRow, NodeRow, SlotRow, TenantRow
from store.node_reports import record_report
from store.snapshot import load_inventory, load_snapshot


def _view(snapshot) -> dict[str, object]:
    """What the schedulers read from a snapshot, as plain data."""
    return {
        "nodes": {
            name: (node.status, [(s.id, s.state, s.holder) for s in node.slots])
            for name, node in sorted(snapshot.nodes.items())
        },
        "tenants": {
            name: (t.gpu_quota, t.active_gpus, t.in_flight_gpus) for name, t in sorted(snapshot.tenants.items())
        },
        "pools": [(p.key, p.nodes) for p in snapshot.pools],
        "groups": {p.key: [g.nodes for g in snapshot.groups(p)] for p in snapshot.pools},
    }


async def _claim(sessions, allocation: str, node: str, index: int, state: str = "active") -> None:
    async with sessions.begin() as session:
        session.add(
            AllocationRow(
                id=allocation,
                tenant="acme",
                state=state,
                shape="gpu_slice",
                gpu_count=1,
                request={},
                workflow_id=f"allocation/{allocation}",
            )
        )
        await session.flush()
        slot = (
            await session.scalars(select(SlotRow).where(SlotRow.node_id == node, SlotRow.slot_index == index))
        ).one()
        slot.state = "reserved"
        session.add(ClaimRow(allocation_id=allocation, attempt=1, slot_id=slot.id, node_id=node, bundle={}))


async def test_cache_matches_a_full_read_and_reloads_only_when_the_fleet_changes(sessions, examples_dir) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    cache = InventoryCache()

    async with sessions() as session:
        assert _view(await cache.snapshot(session)) == _view(await load_snapshot(session))
    assert cache.reloads == 1

    # Claims, a quarantined slot and tenant usage move with every allocation: no reload, but the snapshot shows them.
    await _claim(sessions, "a1", "j22u05", 0)
    await _claim(sessions, "a2", "j22u05", 1, state="provisioning")
    async with sessions.begin() as session:
        await session.execute(
            update(SlotRow).where(SlotRow.node_id == "j22u15", SlotRow.slot_index == 3).values(state="quarantined")
        )
    async with sessions() as session:
        cached, full = await cache.snapshot(session), await load_snapshot(session)
    assert cache.reloads == 1
    assert _view(cached) == _view(full)
    slots = {s.id: s for s in cached.nodes["j22u05"].slots}
    assert (slots["j22u05/0"].state, slots["j22u05/0"].holder) == (SlotState.CLAIMED, "a1")
    assert {s.id: s.state for s in cached.nodes["j22u15"].slots}["j22u15/3"] is SlotState.QUARANTINED
    assert (cached.tenants["acme"].active_gpus, cached.tenants["acme"].in_flight_gpus) == (1, 1)

    # A cordon and a quota change are fleet changes: the inventory is read again, once.
    async with sessions.begin() as session:
        await session.execute(update(NodeRow).where(NodeRow.name == "j22u05").values(status="CORDONED"))
        await session.execute(update(TenantRow).where(TenantRow.name == "acme").values(gpu_quota=3))
    async with sessions() as session:
        cached = await cache.snapshot(session)
        assert _view(cached) == _view(await load_snapshot(session))
        await cache.snapshot(session)
    assert cache.reloads == 2
    assert cached.nodes["j22u05"].status.value == "CORDONED"
    assert cached.tenants["acme"].gpu_quota == 3


async def _pruned(sessions, node: str) -> None:
    """Prune the change log as a sweep with retention 0 does, until `node`'s rows are gone. The prune keeps rows a
    transaction still running anywhere in the cluster could be reading (`store.inventory._PRUNE`), and the test
    PostgreSQL is shared: another test's connection in the middle of a write holds it back for a moment."""
    for _ in range(200):
        async with sessions.begin() as session:
            await session.execute(_PRUNE, {"keep": 0})
        async with sessions() as session:
            left = await session.scalar(text("SELECT count(*) FROM inventory_changes WHERE node = :n"), {"n": node})
            if left == 0:
                return
            holders = (
                await session.execute(
                    text(
                        "SELECT datname, state, backend_xid::text, left(query, 80) FROM pg_stat_activity "
                        "WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
                    )
                )
            ).all()
        await asyncio.sleep(0.05)
    raise AssertionError(f"the change log of {node} was never pruned; transactions holding it back: {holders}")


async def _fresh_and_full(sessions, cache: InventoryCache):
    async with sessions() as session:
        return await cache.snapshot(session), await load_snapshot(session)


async def test_one_node_changes_are_taken_in_without_reading_the_whole_inventory(sessions, examples_dir) -> None:
    """A cordon, a slot's approval, an agent's report that fails a slot, and an agent going down: each re-reads only
    its node (the change log of migration 0008), and the result is what a full read gives."""
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    await report_hosts(sessions, fleet)
    cache = InventoryCache()
    await _fresh_and_full(sessions, cache)
    assert (cache.reloads, cache.node_updates) == (1, 0)

    # A cordon (the route's write), and an operator withdrawing one slot's approval.
    async with sessions.begin() as session:
        await session.execute(update(NodeRow).where(NodeRow.name == "j22u05").values(status="CORDONED"))
    async with sessions.begin() as session:
        await session.execute(
            update(SlotRow).where(SlotRow.node_id == "j22u15", SlotRow.slot_index == 2).values(approved=False)
        )
    cached, full = await _fresh_and_full(sessions, cache)
    assert (cache.reloads, cache.node_updates, cache.nodes_reread) == (1, 1, 2)
    assert _view(cached) == _view(full)
    assert cached.nodes["j22u05"].status.value == "CORDONED"
    assert not {s.index: s for s in cached.nodes["j22u15"].slots}[2].approved

    # The agent of j22u15 reports a host that lost slot 0's GPU: the report's validation fails that slot.
    node = next(n for p in fleet.host_pools() for n in p.nodes if n.name == "j22u15")
    report = simulated_report(node)
    assert report.host is not None
    lost = {s.index: s for s in cached.nodes["j22u15"].slots}[0].gpu_pci
    host = report.host.model_copy(update={"gpus": [g for g in report.host.gpus if g.address != lost]})
    async with sessions.begin() as session:
        await record_report(
            session, "j22u15", report.model_copy(update={"host": host, "topology": host.topology_hash()})
        )
    cached, full = await _fresh_and_full(sessions, cache)
    assert (cache.reloads, cache.node_updates) == (1, 2)
    assert _view(cached) == _view(full)
    assert {s.index: s for s in cached.nodes["j22u15"].slots}[0].validation is not ValidationState.VALID

    # An agent missing a task's pickup goes down; its heartbeat brings it back. Both are one-node changes.
    async with sessions.begin() as session:
        assert await mark_down(session, "j22u05", "missed a pickup")
    cached, full = await _fresh_and_full(sessions, cache)
    assert not cached.nodes["j22u05"].agent_live and not full.nodes["j22u05"].agent_live
    async with sessions.begin() as session:
        await record_heartbeats(session, [("j22u05", datetime.now(UTC), 30.0)])
    cached, full = await _fresh_and_full(sessions, cache)
    assert cached.nodes["j22u05"].agent_live
    assert (cache.reloads, cache.node_updates) == (1, 4)
    assert _livenesses(cached) == _livenesses(full) and _view(cached) == _view(full)

    # Claims and heartbeats that leave an agent live log nothing: nothing to re-read.
    await _claim(sessions, "a1", "j22u15", 1)
    async with sessions.begin() as session:
        await record_heartbeats(session, [("j22u15", datetime.now(UTC), 30.0)])
    cached, full = await _fresh_and_full(sessions, cache)
    assert (cache.reloads, cache.node_updates) == (1, 4)
    assert _view(cached) == _view(full)


def _livenesses(snapshot) -> dict[str, bool]:
    return {name: node.agent_live for name, node in snapshot.nodes.items()}


async def test_fleet_changes_and_a_pruned_log_read_the_whole_inventory(sessions, examples_dir) -> None:
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    await report_hosts(sessions, fleet)
    cache = InventoryCache(sweep_every_seconds=0, keep_changes_seconds=0)
    behind = InventoryCache(sweep_every_seconds=3600)  # never prunes: it stands for a process that fell behind
    await _fresh_and_full(sessions, cache)
    await _fresh_and_full(sessions, behind)

    # A node moved to another pool is a fleet change, however it was written.
    async with sessions.begin() as session:
        node = await session.get(NodeRow, "j22u05")
        other = (await session.scalars(select(NodeRow.pool_id).where(NodeRow.pool_id != node.pool_id))).first()
        node.pool_id = other
    cached, full = await _fresh_and_full(sessions, cache)
    assert (cache.reloads, cache.node_updates) == (2, 0)
    assert _view(cached) == _view(full)

    # A cordon whose log row is pruned (retention 0 here) before a process reads it: that process cannot tell what
    # it missed, and reads the whole inventory.
    await _fresh_and_full(sessions, behind)  # the pool move, first
    assert (behind.reloads, behind.node_updates) == (2, 0)
    async with sessions.begin() as session:
        await session.execute(update(NodeRow).where(NodeRow.name == "j22u15").values(status="CORDONED"))
    await _pruned(sessions, "j22u15")  # what `cache`'s own sweep does just before it reads the log, made certain
    await _fresh_and_full(sessions, cache)
    assert (cache.reloads, cache.node_updates) == (3, 0)
    cached, full = await _fresh_and_full(sessions, behind)
    assert (behind.reloads, behind.node_updates) == (3, 0)
    assert cached.nodes["j22u15"].status.value == "CORDONED"
    assert _view(cached) == _view(full)


async def test_claims_moving_between_decisions_rebuild_only_their_nodes_and_match_a_full_read(
    sessions, examples_dir
) -> None:
    """The cache lays each decision's claims over the last decision's snapshot: a node whose claims did not move is
    the very view it was, one whose claims came, went or were quarantined is rebuilt, and the whole always equals a
    full read."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    cache = InventoryCache()
    await _claim(sessions, "a1", "j22u05", 0)
    first, full = await _fresh_and_full(sessions, cache)
    assert _view(first) == _view(full)

    await _claim(sessions, "a2", "j22u15", 2)
    second, full = await _fresh_and_full(sessions, cache)
    assert _view(second) == _view(full)
    assert second.nodes["j22u05"] is first.nodes["j22u05"]  # its claims did not move: not rebuilt
    assert second.nodes["j22u15"] is not first.nodes["j22u15"]

    async with sessions.begin() as session:  # a1 released, one of j22u15's slots quarantined
        await session.execute(
            update(ClaimRow).where(ClaimRow.allocation_id == "a1").values(released_at=datetime.now(UTC))
        )
        await session.execute(update(AllocationRow).where(AllocationRow.id == "a1").values(state="released"))
        await session.execute(update(SlotRow).where(SlotRow.node_id == "j22u05").values(state="available"))
        await session.execute(
            update(SlotRow).where(SlotRow.node_id == "j22u15", SlotRow.slot_index == 3).values(state="quarantined")
        )
    third, full = await _fresh_and_full(sessions, cache)
    assert _view(third) == _view(full)
    assert all(s.state is SlotState.FREE for s in third.nodes["j22u05"].slots)
    assert {s.id: (s.state, s.holder) for s in third.nodes["j22u15"].slots if s.state is not SlotState.FREE} == {
        "j22u15/2": (SlotState.CLAIMED, "a2"),
        "j22u15/3": (SlotState.QUARANTINED, None),
    }
    assert cache.reloads == 1


async def test_slots_read_in_pages_are_the_slots_read_at_once(sessions, examples_dir, monkeypatch) -> None:
    """A large fleet's slots are read in keyset pages (`store.snapshot._SLOT_BATCH` rows each, 20,000 in
    production); pages of 3 rows cut every host of the example fleet apart, and the inventory must not notice."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    async with sessions() as session:
        whole = await load_inventory(session)
    monkeypatch.setattr(snapshot_module, "_SLOT_BATCH", 3)
    async with sessions() as session:
        paged = await load_inventory(session)

    def slots(inventory) -> dict[str, list[object]]:
        return {name: list(node.slots) for name, node in inventory.snapshot.nodes.items()}

    assert sum(len(s) for s in slots(whole).values()) > 3 * 4  # many pages
    assert slots(paged) == slots(whole) and paged.slots == whole.slots and paged.rows_of == whole.rows_of
