"""The node agent's report loop on a real host side (a /sys-shaped fixture tree) against real PostgreSQL: a host
that changes is reported within seconds, not at the next interval, and what PostgreSQL keeps follows it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from sqlalchemy import select

import worker
from activities.node.reporter import NodeReporter
from fleet.loader import load_fleet
from store.apply import apply_fleet
from store.models import NodeAgentRow, SlotRow
from tests.hosts import sysfs_tree
from tests.hosts.materialise import fixture_fleet
from tests.workflows.lab import StoreSink


async def _verdicts(sessions, node: str) -> dict[int, str]:
    async with sessions() as session:
        rows = await session.execute(select(SlotRow.slot_index, SlotRow.validation).where(SlotRow.node_id == node))
        return dict(rows.all())


async def test_a_rebound_gpu_is_reported_before_the_interval(sessions, tmp_path: Path) -> None:
    fixture = sysfs_tree.hgx_h200()
    root = fixture.write(tmp_path / "host")
    (tmp_path / "fleet.yaml").write_text(fixture_fleet([fixture.node]))
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([tmp_path / "fleet.yaml"]))
    agent = worker.host_agent(fixture.name, tmp_path / "state", root)
    reporter = NodeReporter(agent, StoreSink(sessions), interval_seconds=3600)  # no heartbeat during the test
    running = asyncio.create_task(reporter.run())
    try:
        for _ in range(50):
            if set((await _verdicts(sessions, fixture.name)).values()) == {"valid"}:
                break
            await asyncio.sleep(0.1)
        assert set((await _verdicts(sessions, fixture.name)).values()) == {"valid"}
        assert len(agent.approved.slots) == 8  # learned from the control plane's reply

        # The host driver grabs slot 0's GPU (someone ran nvidia-smi with the driver loaded): rebind it.
        driver = next((root / "sys/bus/pci/devices/0000:1b:00.0").resolve().glob("driver"))
        nvidia = root / "sys/bus/pci/drivers/nvidia"
        nvidia.mkdir(parents=True, exist_ok=True)
        driver.unlink()
        driver.symlink_to(os.path.relpath(nvidia, driver.parent))
        for _ in range(100):
            if (await _verdicts(sessions, fixture.name))[0] == "invalid":
                break
            await asyncio.sleep(0.1)
        assert (await _verdicts(sessions, fixture.name))[0] == "invalid"
        async with sessions() as session:
            agent_row = await session.get(NodeAgentRow, fixture.name)
        assert agent_row is not None and agent_row.state == "live"
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
