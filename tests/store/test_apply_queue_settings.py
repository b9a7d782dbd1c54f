"""`berth apply` writes the fleet file's queueing settings to PostgreSQL: priority classes, a tenant's
weight, priority classes and queue, a region's queueing strategy; and the default class may move in one apply."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.models import PriorityClassRow, RegionRow, TenantRow

FLEET = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: r1}
spec: {status: available, queueingStrategy: StrictFIFO}
---
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: r2}
spec: {status: available}
---
apiVersion: berth.dev/v1alpha1
kind: PriorityClass
metadata: {name: urgent}
spec: {value: 1000, default: true, description: production inference}
---
apiVersion: berth.dev/v1alpha1
kind: PriorityClass
metadata: {name: batch}
spec: {value: -10}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: acme}
spec:
  gpuQuota: 16
  weight: 2.5
  priorityClasses: [urgent]
  queue: {defaultTimeout: 30m, maxTimeout: 2h}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: globex}
spec: {gpuQuota: 8}
"""

DEFAULT_MOVED = FLEET.replace("{value: 1000, default: true,", "{value: 1000,").replace(
    "{value: -10}", "{value: -10, default: true}"
)


async def _classes(sessions) -> list[tuple[str, int, bool, str | None]]:
    async with sessions() as session:
        rows = (await session.scalars(select(PriorityClassRow).order_by(PriorityClassRow.name))).all()
        return [(r.name, r.value, r.is_default, r.description) for r in rows]


async def test_apply_stores_priority_classes_tenant_queue_settings_and_region_strategies(sessions) -> None:
    async with sessions.begin() as session:
        result = await apply_fleet(session, parse_fleet([("fleet.yaml", FLEET)]))
    created = {(c.kind, c.name) for c in result.changes if c.action == "created"}
    assert {("PriorityClass", "urgent"), ("PriorityClass", "batch")} <= created

    assert await _classes(sessions) == [("batch", -10, False, None), ("urgent", 1000, True, "production inference")]
    async with sessions() as session:
        acme, globex = await session.get(TenantRow, "acme"), await session.get(TenantRow, "globex")
        assert (acme.weight, acme.priority_classes) == (2.5, ["urgent"])
        assert acme.queue == {"default_timeout": 1800.0, "max_timeout": 7200.0}
        assert (globex.weight, globex.priority_classes) == (1.0, None)
        assert globex.queue == {"default_timeout": None, "max_timeout": 7 * 24 * 3600.0}
        strategies = {r.name: r.queueing_strategy for r in (await session.scalars(select(RegionRow))).all()}
        assert strategies == {"r1": "StrictFIFO", "r2": "BestEffortFIFO"}

    async with sessions.begin() as session:
        again = await apply_fleet(session, parse_fleet([("fleet.yaml", FLEET)]))
    assert again.changes == []


async def test_the_default_class_moves_from_one_class_to_another_in_one_apply(sessions) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("fleet.yaml", FLEET)]))
    async with sessions.begin() as session:
        moved = await apply_fleet(session, parse_fleet([("fleet.yaml", DEFAULT_MOVED)]))
    assert await _classes(sessions) == [("batch", -10, True, None), ("urgent", 1000, False, "production inference")]
    assert {(c.kind, c.name, c.action) for c in moved.changes} == {
        ("PriorityClass", "batch", "updated"),
        ("PriorityClass", "urgent", "updated"),
    }

    # And back again.
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("fleet.yaml", FLEET)]))
    assert [(name, default) for name, _, default, _ in await _classes(sessions)] == [("batch", False), ("urgent", True)]


async def test_the_database_refuses_a_second_default_class(sessions) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("fleet.yaml", FLEET)]))
    with pytest.raises(IntegrityError, match="uq_priority_classes_default"):
        async with sessions.begin() as session:
            await session.execute(text("UPDATE priority_classes SET is_default = true WHERE name = 'batch'"))


async def test_the_database_refuses_an_unknown_queueing_strategy(sessions) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("fleet.yaml", FLEET)]))
    with pytest.raises(IntegrityError, match="ck_regions_queueing_strategy"):
        async with sessions.begin() as session:
            await session.execute(text("UPDATE regions SET queueing_strategy = 'FIFO' WHERE name = 'r1'"))
