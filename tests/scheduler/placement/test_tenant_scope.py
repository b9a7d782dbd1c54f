"""A tenant's view of the fleet (`scheduler.placement.tenant_scope`) and who holds a slot (`scheduler.placement.bundles.held_slots`).

Over test_placement's fleet: regions us-east (us), us-west (us, degraded), eu-west (eu), ap-south (in,
unavailable); tenants acme (any region), globex (jurisdiction eu), initech (allowed: us-west).
"""

from __future__ import annotations

from contracts.vocabulary import SlotState
from scheduler.placement.bundles import held_slots
from scheduler.placement.capacity import capacity
from scheduler.placement.tenant_scope import tenant_view, usable_regions
from tests.scheduler.placement.test_placement import claim, place, snapshot


def test_a_tenants_regions_are_those_its_allowed_regions_and_jurisdiction_admit() -> None:
    world = snapshot()
    assert usable_regions(world, "acme") == set(world.regions)
    assert usable_regions(world, "globex") == {"eu-west"}
    assert usable_regions(world, "initech") == {"us-west"}
    assert usable_regions(world, "nobody") == frozenset()
    assert tenant_view(world, "nobody").pools == () and tenant_view(world, "nobody").nodes == {}


def test_the_tenant_view_holds_only_its_regions_pools_and_nodes_and_places_as_the_whole_fleet_does() -> None:
    world = snapshot(claim("a1", "use1-a01", 0, 1))
    view = tenant_view(world, "globex")
    assert list(view.regions) == ["eu-west"]
    assert {pool.region for pool in view.pools} == {"eu-west"}
    assert set(view.nodes) == {name for pool in view.pools for name in pool.nodes}
    assert all(pool.region == "eu-west" for name in view.nodes for pool in view.pools_of(name))
    by_pool = {entry.pool: entry for entry in capacity(world)}
    assert capacity(view) == [entry for entry in by_pool.values() if entry.region == "eu-west"]

    for tenant in ("acme", "globex", "initech"):
        whole, seen = place(world, tenant=tenant), place(tenant_view(world, tenant), tenant=tenant)
        assert (seen.placed, seen.region, seen.candidates, seen.plan) == (
            whole.placed,
            whole.region,
            whole.candidates,
            whole.plan,
        )
        regions = seen.explanation.levels[1]
        assert [item.name for item in regions.items or []] == sorted(usable_regions(world, tenant))


def test_who_holds_a_slot_is_data_and_never_the_explanations_text() -> None:
    world = snapshot(claim("theirs-x", "use1-a01", 0), claim("theirs-y", "use1-a01", 5, state="leased"))
    result = place(world, region="us-east", nodes=["use1-a01"])
    assert result.placed and result.chosen is not None and result.chosen.node == "use1-a01"
    assert "theirs-" not in result.model_dump_json()
    assert [
        (held.slot_id, held.gpu_pci, held.state, held.allocation) for held in held_slots(world.nodes["use1-a01"])
    ] == [
        ("use1-a01/0", "0000:1b:00.0", SlotState.CLAIMED, "theirs-x"),
        ("use1-a01/5", "0000:bb:00.0", SlotState.LEASED, "theirs-y"),
    ]
