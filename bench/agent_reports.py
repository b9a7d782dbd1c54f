"""What 10,000 node agents' reports cost the control side: the API process and PostgreSQL.

    python -m bench.agent_reports [--nodes 10000] [--reports 6000] [--interval 60] [--rounds 3] [--concurrency 8]

Starts its own PostgreSQL and the API (`uvicorn --factory api.app:create_app`, a process of its own) on loopback,
applies a fleet of `--nodes` simulated hosts and gives each agent a node token. Every agent first sends its start
report (its whole host) through the API; then, in rounds, agents send their steady reports (heartbeats), several in
flight at once as many agents would, and the benchmark reads the CPU the API process and every PostgreSQL process
spent over the round (psutil), divided by the reports sent. The client's own CPU is not counted: it stands in for
the agents, which run on their hosts.

At the interval, N agents send N / interval reports a second; that rate times the CPU per report, as a share of one
core, is the figure the target (under 10% of one core) is about. Medians over rounds.
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
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.cpu import cpu_seconds, process_tree
from bench.database import embedded_database
from bench.fleets import bench_fleet
from bench.stack import ApiProcess
from devstack.reports import simulated_report
from fleet.loader import parse_fleet
from scheduler.host.report import NodeReport
from store.apply import apply_fleet
from store.models import NodeRow
from store.tokens import create_token

Agent = tuple[str, str, NodeReport]  # node, token, its start report


async def _prepare(sessions: async_sessionmaker[AsyncSession], nodes: int, interval: float) -> list[Agent]:
    fleet = parse_fleet([("bench.yaml", bench_fleet(nodes))])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
        names = (await session.scalars(select(NodeRow.name).order_by(NodeRow.name))).all()
        tokens = {name: await create_token(session, "node", node=name, label="bench") for name in names}
    hosts = {node.name: node for pool in fleet.host_pools() for node in pool.nodes}
    return [(name, tokens[name], simulated_report(hosts[name], interval)) for name in names]


async def _send(
    client: httpx.AsyncClient,
    agents: list[Agent],
    replies: dict[str, str],
    count: int,
    offset: int,
    concurrency: int,
    steady: bool,
) -> None:
    """`count` reports, round-robin over the agents, `concurrency` in flight."""
    queue: asyncio.Queue[Agent] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(agents[(offset + i) % len(agents)])

    async def one_agent_at_a_time() -> None:
        while not queue.empty():
            node, token, start = queue.get_nowait()
            report = start.model_copy(update={"host": None, "approved": replies[node]}) if steady else start
            response = await client.post(
                f"/v1/nodes/{node}/report",
                content=report.model_dump_json(exclude_none=True),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            assert response.status_code == 200, response.text
            replies[node] = response.json()["approved"]

    await asyncio.gather(*(one_agent_at_a_time() for _ in range(concurrency)))


async def main(nodes: int, reports: int, interval: float, rounds: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-reports-") as home:
        async with embedded_database(Path(home) / "pg", pool_size=2) as database:
            started = time.monotonic()
            agents = await _prepare(database.sessions, nodes, interval)
            api = ApiProcess(database.server.url, Path(home) / "state")
            try:
                await api.wait()
                async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
                    replies: dict[str, str] = {}
                    await _send(client, agents, replies, len(agents), 0, concurrency, steady=False)
                    print(
                        f"{nodes} hosts applied, given tokens and reported in full in {time.monotonic() - started:.0f} s"
                    )
                    api_process = psutil.Process(api.process.pid)
                    assert database.server.process is not None
                    postmaster = database.server.process.pid

                    def postgres_cpu() -> float:
                        return cpu_seconds(process_tree(postmaster), reaped_by=[postmaster])

                    await _send(client, agents, replies, min(reports, len(agents)), 0, concurrency, steady=True)  # warm
                    api_ms, pg_ms = [], []
                    for n in range(rounds):
                        api_cpu, pg_cpu = cpu_seconds([api_process]), postgres_cpu()
                        await _send(client, agents, replies, reports, (n + 1) * reports, concurrency, steady=True)
                        api_ms.append((cpu_seconds([api_process]) - api_cpu) / reports * 1000)
                        pg_ms.append((postgres_cpu() - pg_cpu) / reports * 1000)
            finally:
                api.stop()
    api_median, pg_median = statistics.median(api_ms), statistics.median(pg_ms)
    rate = nodes / interval
    print(f"{'steady reports a second':>34}: {rate:.0f} ({nodes} agents every {interval:.0f} s)")
    print(f"{'API process CPU per report':>34}: {api_median:.3f} ms (rounds: {', '.join(f'{v:.3f}' for v in api_ms)})")
    print(f"{'PostgreSQL CPU per report':>34}: {pg_median:.3f} ms (rounds: {', '.join(f'{v:.3f}' for v in pg_ms)})")
    print(f"{'control side, share of one core':>34}: {rate * (api_median + pg_median) / 1000:.1%}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--reports", type=int, default=6_000)
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.nodes, arguments.reports, arguments.interval, arguments.rounds, arguments.concurrency))
