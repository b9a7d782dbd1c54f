"""What 10,000 node agents' reports cost the control side: the API's report route and PostgreSQL.

    python -m bench.agent_reports [--nodes 10000] [--reports 4000] [--interval 30] [--rounds 3]

Starts its own PostgreSQL (loopback), applies a fleet of `--nodes` simulated hosts, takes in every agent's start
report (its whole host) and gives each agent a node token. Then, in rounds, every agent's steady report goes through
the API's real route in this process (httpx over ASGI: no sockets), and the benchmark measures CPU per report:

- api: this process's CPU, less the same requests answered by a bare ASGI app in the same round (the client's own
  cost, and httpx's, subtracted as a baseline);
- postgres: the CPU of every PostgreSQL process over the round.

At the default interval, 10,000 agents send 10,000 / interval reports a second: the figure the issue asks for is that
rate times the CPU per report, as a share of one core. Medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from fastapi import FastAPI
from sqlalchemy import select

from api.app import create_app
from bench.allocation import fleet_yaml
from devstack.postgres import EmbeddedPostgres
from devstack.reports import report_hosts
from fleet.loader import parse_fleet
from scheduler.host.report import AgentInfo, NodeReport, approved_hash
from store.apply import apply_fleet
from store.db import create_engine, session_factory
from store.migrate import upgrade
from store.models import NodeAgentRow, SlotRow
from store.node_reports import slot_of
from store.tokens import create_token


def _postgres_cpu(server: EmbeddedPostgres) -> float:
    total = 0.0
    for process in psutil.process_iter(["cmdline"]):
        try:
            if str(server.data_dir) in " ".join(process.info["cmdline"] or []) or _child_of(process, server):
                times = process.cpu_times()
                total += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _child_of(process: psutil.Process, server: EmbeddedPostgres) -> bool:
    parent = process.parent()
    return parent is not None and str(server.data_dir) in " ".join(parent.cmdline())


async def _prepare(
    server: EmbeddedPostgres, nodes: int, interval: float
) -> tuple[object, list[tuple[str, str, str, str]]]:
    engine = create_engine(server.url, pool_size=10)
    await upgrade(engine)
    sessions = session_factory(engine)
    fleet = parse_fleet([("bench.yaml", fleet_yaml(nodes))])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    await report_hosts(sessions, fleet, interval)  # every agent's start report, with its whole host
    agents = []
    async with sessions.begin() as session:
        topologies = dict((await session.execute(select(NodeAgentRow.node, NodeAgentRow.topology))).all())
        slots: dict[str, list] = {}
        for row in (await session.scalars(select(SlotRow).order_by(SlotRow.node_id, SlotRow.slot_index))).all():
            slots.setdefault(row.node_id, []).append(slot_of(row))
        for node in sorted(topologies):
            token = await create_token(session, "node", node=node, label="bench")
            agents.append((node, token, topologies[node], approved_hash(slots[node])))
    return sessions, agents, engine


async def _round(client: httpx.AsyncClient, agents: list, reports: int, interval: float, offset: int) -> None:
    info = AgentInfo(version="bench", interval_seconds=interval)
    for i in range(reports):
        node, token, topology, approved = agents[(offset + i) % len(agents)]
        body = NodeReport(agent=info, topology=topology, approved=approved).model_dump_json(exclude_none=True)
        response = await client.post(
            f"/v1/nodes/{node}/report", content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )  # fmt: skip
        assert response.status_code == 200, response.text


def _bare_app() -> FastAPI:
    bare = FastAPI()

    @bare.post("/v1/nodes/{node}/report")
    async def report(node: str) -> dict[str, object]:
        return {"node": node, "live": True, "approved": "0"}

    return bare


async def main(nodes: int, reports: int, interval: float, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-reports-") as home:
        server = EmbeddedPostgres(Path(home) / "pg", durable=False).start()
        try:
            started = time.monotonic()
            sessions, agents, engine = await _prepare(server, nodes, interval)
            print(f"{nodes} hosts applied, reported and given tokens in {time.monotonic() - started:.0f} s")
            app = create_app(sessions=sessions)
            services = app.state.services
            for node, _, topology, approved in agents:  # what each agent's full report left in the API's memory
                services.heartbeats.confirm(node, topology, approved)
            real = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://berth.bench")
            bare = httpx.AsyncClient(transport=httpx.ASGITransport(app=_bare_app()), base_url="http://berth.bench")
            await _round(real, agents, min(reports, len(agents)), interval, 0)  # warm: token cache, first flushes
            api_ms, pg_ms, flushes = [], [], []
            for n in range(rounds):
                cpu = time.process_time()
                await _round(bare, agents, reports, interval, n * reports)
                baseline = time.process_time() - cpu
                before_flushes, pg = services.heartbeats.flushes, _postgres_cpu(server)
                cpu = time.process_time()
                await _round(real, agents, reports, interval, n * reports)
                api_ms.append((time.process_time() - cpu - baseline) / reports * 1000)
                pg_ms.append((_postgres_cpu(server) - pg) / reports * 1000)
                flushes.append(services.heartbeats.flushes - before_flushes)
            await real.aclose()
            await bare.aclose()
            await engine.dispose()
        finally:
            server.stop()
    api, pg = statistics.median(api_ms), statistics.median(pg_ms)
    rate = nodes / interval
    print(f"{'reports a second':>34}: {rate:.0f} ({nodes} agents every {interval:.0f} s)")
    print(f"{'API CPU per steady report':>34}: {api:.3f} ms (rounds: {', '.join(f'{v:.3f}' for v in api_ms)})")
    print(f"{'PostgreSQL CPU per steady report':>34}: {pg:.3f} ms (rounds: {', '.join(f'{v:.3f}' for v in pg_ms)})")
    print(f"{'flushes per round':>34}: {statistics.median(flushes):.0f} ({reports} reports a round)")
    print(f"{'control side, share of one core':>34}: {rate * (api + pg) / 1000:.1%}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--reports", type=int, default=4_000)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.nodes, arguments.reports, arguments.interval, arguments.rounds))
