"""The node agent's report loop on a real host side (a /sys-shaped fixture tree) against real PostgreSQL: a host
that changes is reported within seconds, not at the next interval, and what PostgreSQL keeps follows it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio.testing import WorkflowEnvironment

from agent import serve
from agent.reporter import HttpReportSink, NodeReporter, ReportRefused
from agent.serve import host_agent
from fleet.loader import load_fleet
from store.apply import apply_fleet
from store.models import NodeAgentRow, SlotRow
from store.tokens import create_token
from tests.api.served import served_api
from tests.api.stack import api_fleet
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
    agent = host_agent(fixture.name, tmp_path / "state", root)
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


async def test_an_agent_reports_through_the_real_api_with_its_node_token(
    database_url: str, temporal_env: WorkflowEnvironment, sessions, tmp_path: Path
) -> None:
    """`HttpReportSink` against the API served over HTTP: the node's own token is accepted, the host's slots are
    validated and the agent learns it holds the approval the control plane has; another node's token, or none, is
    refused for good (the loop waits out the interval); an API that is not there is a connection error, which the
    loop retries soon."""
    client = temporal_env.client
    (tmp_path / "fleet.yaml").write_text(api_fleet())
    agent = serve.simulated_agent(tmp_path / "fleet.yaml", "small", tmp_path / "state")
    with served_api(
        database_url, client.service_client.config.target_host, client.namespace, api_fleet(), tmp_path / "lab"
    ) as served:
        async with sessions.begin() as session:
            token, other = (
                await create_token(session, "node", node="small"),
                await create_token(session, "node", node="big"),
            )
        reply = await NodeReporter(agent, HttpReportSink(served.base_url, token)).report_once()
        assert (reply.node, reply.live, reply.approved) == ("small", True, agent.approved.hash)
        assert reply.validation is not None and {v.state for v in reply.validation.slots} == {"valid"}

        with pytest.raises(ReportRefused, match=r"\(403\)"):
            await NodeReporter(agent, HttpReportSink(served.base_url, other)).report_once()
        with pytest.raises(ReportRefused, match=r"\(401\)"):
            await NodeReporter(agent, HttpReportSink(served.base_url, "berth_not_a_token")).report_once()

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{unused.getsockname()[1]}"
    with pytest.raises(OSError):  # not ReportRefused (a RuntimeError): the loop tries again within seconds
        await NodeReporter(agent, HttpReportSink(down, token, timeout=2)).report_once()
