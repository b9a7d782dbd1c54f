"""The schema itself guards the invariants: these tests go around the application code on purpose."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from fleet.loader import load_fleet
from store.apply import apply_fleet
from store.db import create_engine
from store.migrate import upgrade
from store.models import AllocationRow, ClaimRow, SlotRow, TenantRow

TABLES = {
    "regions",
    "clusters",
    "pools",
    "inference_classes",
    "nodes",
    "node_resource_slots",
    "tenants",
    "api_tokens",
    "allocations",
    "allocation_resource_claims",
    "allocation_events",
    "model_deployments",
    "model_replicas",
    "replica_pool_usage",
    "inventory_version",
    "node_agents",
    "liveness_version",
    "audit_runs",
    "audit_findings",
    "audit_repairs",
    "model_caches",
    "inventory_changes",
    "inventory_changes_pruned",
    "priority_classes",
    "queue_entries",
    "cohorts",
    "usage_intervals",
    "usage_totals",
    "usage_hourly",
    "usage_rollup",
    "usage_decay",
}


async def test_migration_creates_every_table_from_empty(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    try:
        await upgrade(engine)
        await upgrade(engine)  # a second run finds nothing to do
        async with engine.connect() as connection:
            tables = await connection.run_sync(lambda c: set(inspect(c).get_table_names()))
            version = (await connection.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
    finally:
        await engine.dispose()
    assert TABLES <= tables
    assert version == "0025"


async def _fleet_with_allocation(
    sessions: async_sessionmaker[AsyncSession], examples_dir, allocation_id: str
) -> SlotRow:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
        tenant = await session.get(TenantRow, "acme")
        assert tenant is not None
        for alloc in (allocation_id, f"{allocation_id}-other"):
            session.add(
                AllocationRow(
                    id=alloc,
                    tenant="acme",
                    state="claiming",
                    shape="gpu_slice",
                    gpu_count=1,
                    request={},
                    workflow_id=f"allocation/{alloc}",
                )
            )
        slot = (
            await session.scalars(select(SlotRow).where(SlotRow.node_id == "j22u05", SlotRow.slot_index == 0))
        ).one()
        session.add(ClaimRow(allocation_id=allocation_id, attempt=1, slot_id=slot.id, node_id="j22u05", bundle={}))
    return slot


async def test_database_rejects_a_second_active_claim_on_a_slot(sessions, examples_dir) -> None:
    slot = await _fleet_with_allocation(sessions, examples_dir, "a1")
    with pytest.raises(IntegrityError, match="uq_allocation_resource_claims_active_slot"):
        async with sessions.begin() as session:
            session.add(ClaimRow(allocation_id="a1-other", attempt=1, slot_id=slot.id, node_id="j22u05", bundle={}))


async def test_a_released_claim_frees_the_slot_for_the_next_one(sessions, examples_dir) -> None:
    slot = await _fleet_with_allocation(sessions, examples_dir, "a2")
    async with sessions.begin() as session:
        await session.execute(
            text("UPDATE allocation_resource_claims SET released_at = now() WHERE allocation_id = 'a2'")
        )
        session.add(ClaimRow(allocation_id="a2-other", attempt=1, slot_id=slot.id, node_id="j22u05", bundle={}))
    async with sessions() as session:
        active = (await session.scalars(select(ClaimRow).where(ClaimRow.released_at.is_(None)))).all()
    assert [c.allocation_id for c in active] == ["a2-other"]


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        # The same fabric VF on two slots of one host would let two VMs share an isolated fabric function.
        (
            "UPDATE node_resource_slots SET fabric_vf_pci_address = '0000:1a:00.2' "
            "WHERE node_id = 'j22u05' AND slot_index = 1",
            "uq_node_resource_slots_node_id_fabric_vf",
        ),
        (
            "UPDATE node_resource_slots SET slot_index = 0 WHERE node_id = 'j22u05' AND slot_index = 1",
            "uq_node_resource_slots_node_id_slot_index",
        ),
        ("UPDATE node_resource_slots SET state = 'stolen' WHERE node_id = 'j22u05'", "ck_node_resource_slots_state"),
        ("UPDATE allocations SET gpu_count = 0", "ck_allocations_gpu_count"),
        ("UPDATE tenants SET gpu_quota = -1", "ck_tenants_gpu_quota"),
    ],
)
async def test_schema_constraints(sessions, examples_dir, statement: str, constraint: str) -> None:
    await _fleet_with_allocation(sessions, examples_dir, "a3")
    with pytest.raises(IntegrityError, match=constraint):
        async with sessions.begin() as session:
            await session.execute(text(statement))


async def test_shared_parent_slots_may_repeat_the_parent_but_not_a_vf(sessions, examples_dir) -> None:
    await _fleet_with_allocation(sessions, examples_dir, "a4")
    async with sessions() as session:
        parents = (
            await session.scalars(select(SlotRow.fabric_parent_pci_address).where(SlotRow.node_id == "j22u15"))
        ).all()
    assert set(parents) == {"0000:1a:00.0"} and len(parents) == 8


async def test_the_migrated_schema_takes_exactly_the_states_an_allocation_can_be_in(engine) -> None:
    """The allocation states live in one place (contracts.allocation); the migrations write them into a CHECK
    constraint of their own. A state the workflow can reach but no migration added would fail its write."""
    from contracts.allocation import ALLOCATION_STATES

    async with engine.connect() as connection:
        definition = await connection.scalar(
            text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_allocations_state'")
        )
    assert set(re.findall(r"'([a-z_]+)'", definition)) == set(ALLOCATION_STATES)
