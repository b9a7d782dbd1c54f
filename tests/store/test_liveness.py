"""Agent liveness in PostgreSQL: what makes a node's agent live or down, and that only real changes move the
liveness version control workers watch (so heartbeats never make them re-read anything)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import yaml
from sqlalchemy import select, text

from devstack.reports import report_hosts, simulated_report
from fleet.loader import load_fleet, parse_fleet
from scheduler.host.report import approved_hash
from store.apply import apply_fleet
from store.inventory import InventoryCache
from store.liveness import expire_stale, liveness_version, load_liveness, mark_down, record_heartbeats
from store.models import NodeAgentRow, SlotRow
from store.node_reports import record_report, slot_of


async def _agent(sessions, node: str) -> NodeAgentRow:
    async with sessions() as session:
        row = await session.get(NodeAgentRow, node)
        assert row is not None
        return row


async def test_live_down_and_back(sessions, examples_dir) -> None:
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
        never = await load_liveness(session)
    assert "j22u05" in never.down  # no agent has reported yet
    reported = await report_hosts(sessions, fleet)
    async with sessions() as session:
        live = await load_liveness(session)
    assert live.down == {"j22u11"} and live.version > never.version and "j22u05" in reported

    # Heartbeats from live agents change no state: the version stays.
    now = datetime.now(UTC)
    async with sessions.begin() as session:
        await record_heartbeats(session, [(node, now, 30.0) for node in reported])
        assert await liveness_version(session) == live.version
    assert (await _agent(sessions, "j22u05")).expires_at == now + timedelta(seconds=90)

    # A pickup timeout takes the node down at once; a heartbeat sent before it does not bring it back.
    async with sessions.begin() as session:
        assert await mark_down(session, "j22u05", "agent_unreachable: the node agent did not pick the task up")
    async with sessions.begin() as session:
        await record_heartbeats(session, [("j22u05", now, 30.0)])
    async with sessions() as session:
        down = await load_liveness(session)
    assert "j22u05" in down.down and down.version > live.version
    async with sessions.begin() as session:
        await record_heartbeats(session, [("j22u05", datetime.now(UTC) + timedelta(seconds=1), 30.0)])
    async with sessions() as session:
        assert "j22u05" not in (await load_liveness(session)).down

    # An agent that stops reporting expires.
    async with sessions.begin() as session:
        await session.execute(
            text("UPDATE node_agents SET expires_at = now() - interval '1 second' WHERE node = 'j22u15'")
        )
        assert await expire_stale(session) == ["j22u15"]
        assert await expire_stale(session) == []
    agent = await _agent(sessions, "j22u15")
    assert agent.state == "down" and agent.down_reason.startswith("no report since")


async def test_the_inventory_cache_sees_liveness_without_reloading_the_inventory(sessions, examples_dir) -> None:
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    await report_hosts(sessions, fleet)
    cache = InventoryCache()
    async with sessions() as session:
        before = await cache.snapshot(session)
    assert before.nodes["j22u05"].agent_live and not before.nodes["j22u11"].agent_live
    async with sessions.begin() as session:
        await mark_down(session, "j22u05", "agent_unreachable")
    async with sessions() as session:
        after = await cache.snapshot(session)
        rows = (await session.execute(select(NodeAgentRow.node).where(NodeAgentRow.state == "down"))).all()
    assert not after.nodes["j22u05"].agent_live and rows == [("j22u05",)]
    assert cache.reloads == 1  # the inventory itself was read once; only the down set was re-read


async def test_two_first_reports_at_once_both_succeed(sessions, examples_dir) -> None:
    """An agent restarted while its old process still reports: two first reports race to create the agent's row."""
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    node = next(n for pool in fleet.host_pools() for n in pool.nodes if n.name == "j22u05")

    async def report() -> bool:
        async with sessions.begin() as session:
            return (await record_report(session, node.name, simulated_report(node))).live

    assert await asyncio.gather(report(), report()) == [True, True]
    assert (await _agent(sessions, "j22u05")).state == "live"


async def test_pruning_a_slot_moves_the_nodes_approval_so_its_agent_learns_it(sessions, examples_dir) -> None:
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    await report_hosts(sessions, fleet)
    before = (await _agent(sessions, "j22u05")).approved
    text = (examples_dir / "fleet.yaml").read_text()
    documents = [d for d in yaml.safe_load_all(text) if d]
    for document in documents:
        for pool in (document.get("spec") or {}).get("nodePools", []) if document["kind"] == "InferenceCluster" else []:
            for node in pool.get("nodes", []):
                if node["name"] == "j22u05":
                    node["slots"] = node["slots"][:-1]
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("fleet.yaml", yaml.safe_dump_all(documents))]), prune=True)
        rows = (await session.scalars(select(SlotRow).where(SlotRow.node_id == "j22u05"))).all()
        expected = approved_hash([slot_of(row) for row in rows])
    after = (await _agent(sessions, "j22u05")).approved
    assert after == expected and after != before
