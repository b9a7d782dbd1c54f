"""The control worker's inventory cache: always the snapshot a full read would give, re-reading the inventory only
when the fleet changed (database triggers move the version; claims and slot states do not)."""

from __future__ import annotations

from sqlalchemy import select, update

from devstack.reports import report_hosts
from fleet.loader import load_fleet
from scheduler.views import SlotState
from store.apply import apply_fleet
from store.inventory import InventoryCache
from store.models import AllocationRow, ClaimRow, NodeRow, SlotRow, TenantRow
from store.snapshot import load_snapshot


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
        session.add(AllocationRow(id=allocation, tenant="acme", state=state, shape="gpu_slice", gpu_count=1,
                                  request={}, workflow_id=f"allocation/{allocation}"))  # fmt: skip
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
