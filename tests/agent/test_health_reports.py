"""Slot health through the agent's report loop into PostgreSQL and placement, on a fixture host shaped
like an HGX H200's /sys: a GPU whose AER fatal counter rises is `failed` within one look of the agent (seconds, not
the report interval), stays failed once the counter stands still, and placement stops choosing it at once
(`gpu_unhealthy`); a link trained down is `degraded`; a GPU that falls off the bus is out of placement too."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from sqlalchemy import select

from agent.reporter import NodeReporter
from agent.serve import host_agent
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from fleet.loader import load_fleet
from fleet.node import Node
from scheduler.placement.cluster import find_candidates
from store.apply import apply_fleet
from store.inventory import InventoryCache
from store.models import SlotRow
from tests.hosts import sysfs_tree
from tests.hosts.materialise import fixture_fleet
from tests.workflows.lab import StoreSink


async def _health(sessions, node: str) -> dict[int, tuple[str, str | None]]:
    async with sessions() as session:
        rows = await session.execute(
            select(SlotRow.slot_index, SlotRow.health, SlotRow.health_reason).where(SlotRow.node_id == node)
        )
        return {index: (health, reason) for index, health, reason in rows}


async def _until(sessions, node: str, index: int, state: str, timeout: float = 15.0) -> str | None:
    """The slot's health reason once it is `state` (the agent looks every few seconds)."""
    for _ in range(int(timeout * 10)):
        health, reason = (await _health(sessions, node))[index]
        if health == state:
            return reason
        await asyncio.sleep(0.1)
    raise AssertionError(f"slot {index} stayed {(await _health(sessions, node))[index]}, not {state}")


@contextlib.asynccontextmanager
async def _reporting(sessions, tmp_path: Path) -> AsyncIterator[tuple[Path, Node]]:
    fixture = sysfs_tree.hgx_h200()
    root = fixture.write(tmp_path / "host")
    node = Node.model_validate(fixture.node)
    for slot in node.slots:
        for address in (slot.gpu_pci, slot.fabric_vf_pci):
            if address:
                sysfs_tree.write_pcie_health(root, address)
    (tmp_path / "fleet.yaml").write_text(fixture_fleet([fixture.node]))
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([tmp_path / "fleet.yaml"]))
    agent = host_agent(fixture.name, tmp_path / "state", root)
    reporter = NodeReporter(agent, StoreSink(sessions), interval_seconds=3600)  # no heartbeat during the test
    running = asyncio.create_task(reporter.run())
    try:
        for _ in range(150):  # the agent's first look at the slots it learned from the reply is its baseline
            if reporter.sent_health is not None and len(reporter.sent_health) == len(node.slots):
                break
            await asyncio.sleep(0.1)
        assert {state for state, _ in (await _health(sessions, fixture.name)).values()} == {"healthy"}
        yield root, node
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def _placement(sessions, gpus: int) -> tuple[list[str], Reason | None]:
    async with sessions() as session:
        snapshot = await InventoryCache().snapshot(session)
    decision = find_candidates(snapshot, PlacementRequest(gpu_count=gpus, region="lab"), "lab")
    return [c.node for c in decision.candidates], decision.refusal.code if decision.refusal else None


async def test_a_rising_fatal_aer_count_fails_the_slot_until_repair_and_takes_it_out_of_placement(
    sessions, tmp_path: Path
) -> None:
    async with _reporting(sessions, tmp_path) as (root, node):
        assert await _placement(sessions, 8) == ([node.name], None)
        gpu = node.slots[2].gpu_pci
        sysfs_tree.write_pcie_health(root, gpu, fatal=1)
        reason = await _until(sessions, node.name, 2, "failed")
        assert reason == f"the GPU {gpu} logged 1 fatal PCIe errors (AER) since the last report"
        # Out of placement at once: 8 GPUs no longer fit, and the refusal says why; 7 still do.
        candidates, refusal = await _placement(sessions, 8)
        assert candidates == [] and refusal is Reason.INSUFFICIENT_CAPACITY
        async with sessions() as session:
            snapshot = await InventoryCache().snapshot(session)
        detail = find_candidates(snapshot, PlacementRequest(gpu_count=8, region="lab"), "lab", detail=True)
        assert "would fit but for unhealthy GPUs" in detail.refusal.message  # type: ignore[union-attr]
        assert (await _placement(sessions, 7))[0] == [node.name]

        # The counter stands still now: the agent judges the slot healthy again, the control plane keeps it failed.
        await asyncio.sleep(6)  # more than one look of the agent (CHECK_SECONDS)
        assert (await _health(sessions, node.name))[2][0] == "failed"


async def test_a_link_trained_down_degrades_and_a_gpu_off_the_bus_fails(sessions, tmp_path: Path) -> None:
    async with _reporting(sessions, tmp_path) as (root, node):
        vf = node.slots[4].fabric_vf_pci
        assert vf is not None
        sysfs_tree.write_pcie_health(root, vf, speed="16.0 GT/s PCIe", width=8)
        reason = await _until(sessions, node.name, 4, "degraded")
        assert reason == f"the fabric VF {vf}'s link trained at 16.0 GT/s x8, below its 32.0 GT/s x16"

        gpu = node.slots[6].gpu_pci
        device = (root / "sys/bus/pci/devices" / gpu).resolve()
        (root / "sys/bus/pci/devices" / gpu).unlink()
        shutil.rmtree(device)
        assert await _until(sessions, node.name, 6, "failed") == f"the GPU {gpu} is gone from the PCI bus"
        assert (await _placement(sessions, 7))[1] is Reason.INSUFFICIENT_CAPACITY  # 6 healthy slots left
