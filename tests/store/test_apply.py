"""`berth apply` semantics against the real database: idempotent, all-or-nothing, and careful with claimed capacity."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from fleet.loader import load_fleet, parse_fleet
from store.apply import ApplyRefused, apply_fleet
from store.models import AllocationRow, ClaimRow, ClusterRow, NodeRow, PoolRow, RegionRow, SlotRow, TenantRow
from store.node_reports import revalidate
from store.nodes import quarantined_slots, unvalidated_slots


async def _counts(sessions) -> dict[str, int]:
    async with sessions() as session:
        return {
            model.__tablename__: await session.scalar(select(func.count()).select_from(model))
            for model in (RegionRow, TenantRow, ClusterRow, PoolRow, NodeRow, SlotRow)
        }


async def test_applying_the_example_fleet_twice_is_a_no_op(sessions, examples_dir: Path) -> None:
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        first = await apply_fleet(session, fleet)
    assert first.count("created") > 0 and first.count("updated") == 0
    before = await _counts(sessions)
    assert before == {"regions": 2, "tenants": 2, "clusters": 5, "pools": 8, "nodes": 9, "node_resource_slots": 60}

    async with sessions.begin() as session:
        second = await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    assert second.changes == []
    assert second.summary().startswith("no changes")
    assert await _counts(sessions) == before


def _edit(examples_dir: Path, old: str, new: str) -> str:
    text = (examples_dir / "fleet.yaml").read_text()
    assert old in text
    return text.replace(old, new, 1)


async def test_an_edited_field_updates_only_that_object(sessions, examples_dir: Path) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    edited = parse_fleet([("fleet.yaml", _edit(examples_dir, "gpuQuota: 32", "gpuQuota: 48"))])
    async with sessions.begin() as session:
        result = await apply_fleet(session, edited)
    assert [(c.kind, c.name, c.action) for c in result.changes] == [("Tenant", "acme", "updated")]
    async with sessions() as session:
        assert (await session.get(TenantRow, "acme")).gpu_quota == 48


async def test_a_cordon_survives_reapplying_the_same_file(sessions, examples_dir: Path) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
        (await session.get(NodeRow, "j22u05")).status = "CORDONED"
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    async with sessions() as session:
        assert (await session.get(NodeRow, "j22u05")).status == "CORDONED"


def _without_metal_cluster(examples_dir: Path) -> str:
    text = (examples_dir / "fleet.yaml").read_text()
    start = text.index("---\napiVersion: berth.dev/v1alpha1\nkind: InferenceCluster\nmetadata:\n  name: use1-metal")
    end = text.index("---", start + 3)
    return text[:start] + text[end:]


async def test_objects_missing_from_the_file_are_kept_unless_pruned(sessions, examples_dir: Path) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    smaller = parse_fleet([("fleet.yaml", _without_metal_cluster(examples_dir))])

    async with sessions.begin() as session:
        kept = await apply_fleet(session, smaller)
    assert ("InferenceCluster", "use1-metal", "kept") in {(c.kind, c.name, c.action) for c in kept.changes}
    assert "apply with --prune" in kept.summary()
    assert (await _counts(sessions))["nodes"] == 9

    async with sessions.begin() as session:
        pruned = await apply_fleet(session, smaller, prune=True)
    assert ("InferenceCluster", "use1-metal", "deleted") in {(c.kind, c.name, c.action) for c in pruned.changes}
    counts = await _counts(sessions)
    assert counts["clusters"] == 4 and counts["nodes"] == 7 and counts["node_resource_slots"] == 44


async def test_pruning_capacity_with_an_active_claim_is_refused_and_changes_nothing(
    sessions, examples_dir: Path
) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
        session.add(
            AllocationRow(
                id="bm-1",
                tenant="acme",
                state="active",
                shape="baremetal",
                gpu_count=8,
                request={},
                workflow_id="allocation/bm-1",
            )
        )
        slot = (await session.scalars(select(SlotRow).where(SlotRow.node_id == "use1-h100-01"))).first()
        session.add(ClaimRow(allocation_id="bm-1", attempt=1, slot_id=slot.id, node_id="use1-h100-01", bundle={}))
    before = await _counts(sessions)

    smaller = parse_fleet([("fleet.yaml", _without_metal_cluster(examples_dir))])
    with pytest.raises(ApplyRefused, match=r"node use1-h100-01 has 1 active claim\(s\) by allocation\(s\) bm-1"):
        async with sessions.begin() as session:
            await apply_fleet(session, smaller, prune=True)
    assert await _counts(sessions) == before


async def test_two_slots_can_swap_fabric_vfs_in_one_apply(sessions, examples_dir: Path) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    text = (examples_dir / "fleet.yaml").read_text()
    swapped = (
        text.replace('fabricVfPci: "0000:1a:00.2"', "SWAP")
        .replace('fabricVfPci: "0000:3a:00.2"', 'fabricVfPci: "0000:1a:00.2"')
        .replace("SWAP", 'fabricVfPci: "0000:3a:00.2"')
    )
    async with sessions.begin() as session:
        result = await apply_fleet(session, parse_fleet([("fleet.yaml", swapped)]))
    assert {c.name for c in result.changes} == {"j22u05/0", "j22u05/1", "j22u11/0", "j22u11/1"}


async def test_a_model_service_beside_the_inventory_is_carried_not_written(sessions, examples_dir: Path) -> None:
    """Modelplane's directories hold ModelServices; an apply checks them and says it did not write them,
    rather than refusing the whole file set."""
    fleet = load_fleet([examples_dir / "fleet.yaml", examples_dir / "modelplane" / "service.yaml"])
    async with sessions.begin() as session:
        result = await apply_fleet(session, fleet)
    assert [(c.kind, c.name, c.action) for c in result.changes if c.kind == "ModelService"] == [
        ("ModelService", "ml/llama-70b", "carried")
    ]
    assert result.summary().endswith("; 1 ModelService checked and not written (routing, not inventory)")
    assert await _counts(sessions) == {
        "regions": 2,
        "tenants": 2,
        "clusters": 5,
        "pools": 8,
        "nodes": 9,
        "node_resource_slots": 60,
    }


async def test_lists_of_more_nodes_than_a_statement_has_parameters_are_read(sessions, examples_dir: Path) -> None:
    """PostgreSQL's protocol carries at most 32,767 parameters in a statement; a fleet of 50,000 hosts once failed
    to apply because the re-validation after it listed every node in `IN (...)`. Lists of nodes and slots are bound
    as one array now (`store.db.among`)."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
    many = [f"no-such-node-{i:05d}" for i in range(40_000)] + ["j22u05"]
    async with sessions.begin() as session:
        await revalidate(session, many)
        assert {row.node_id for row in await unvalidated_slots(session, many)} == {"j22u05"}
        assert await quarantined_slots(session, many) == []
