"""Resident memory of a control worker holding a large inventory, and of one node agent (issue 14, target 6).

    python -m bench.memory [--nodes 10000]

Starts PostgreSQL and a Temporal dev server on loopback, applies a fleet of `--nodes` 8-GPU hosts, then measures
in processes of their own, as they run in production:
- a control worker (`worker.control_worker`, polling) before and after its `InventoryCache` holds the whole
  inventory (the snapshot every placement decision starts from);
- one node agent serving its task queue (`bench/agent_host.py` with a one-host fleet).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

import worker
from bench.allocation import Stack, fleet_yaml
from store.db import create_engine, session_factory
from store.inventory import InventoryCache


def _rss_mb(pid: int | None = None) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


async def control(database_url: str, address: str) -> None:
    """The child: a polling control worker, then the inventory loaded into a cache of the kind it keeps."""
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    engine = create_engine(database_url, pool_size=5)
    sessions = session_factory(engine)
    control_worker = worker.control_worker(client, sessions, "memory.control")
    running = asyncio.create_task(control_worker.run())
    await asyncio.sleep(2)
    gc.collect()
    idle = _rss_mb()
    cache = InventoryCache()
    async with sessions() as session:
        snapshot = await cache.snapshot(session)
    gc.collect()
    print(f"{idle:.0f} {_rss_mb():.0f} {len(snapshot.nodes)} {sum(len(n.slots) for n in snapshot.nodes.values())}",
          flush=True)  # fmt: skip
    await control_worker.shutdown()
    await running
    await engine.dispose()


async def main(nodes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-memory-") as home:
        stack = Stack(Path(home))
        try:
            await stack.connect()
            started = time.monotonic()
            await stack.load_fleet(nodes)
            print(f"{nodes} hosts applied in {time.monotonic() - started:.0f} s")
            out = subprocess.run(
                [sys.executable, "-m", "bench.memory", "--child-control", stack.postgres.url, stack.temporal.address],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            idle, loaded, held_nodes, held_slots = float(out[0]), float(out[1]), int(out[2]), int(out[3])

            one = Path(home) / "one.yaml"
            one.write_text(fleet_yaml(1))
            agent = subprocess.Popen(
                [sys.executable, "-m", "bench.agent_host", str(one), str(Path(home) / "agent"), stack.temporal.address,
                 "memory.node."], stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert agent.stdout is not None
            await asyncio.to_thread(agent.stdout.readline)  # "ready"
            await asyncio.sleep(2)
            agent_mb = _rss_mb(agent.pid)
            agent.terminate()
            agent.wait(30)
        finally:
            await stack.engine.dispose()
            stack.close()
    print("\n| process | RSS MB |")
    print("|---|---:|")
    print(f"| control worker, polling, no inventory yet | {idle:.0f} |")
    print(f"| control worker holding {held_nodes:,} nodes / {held_slots:,} slots | {loaded:.0f} |")
    print(f"| one node agent, serving its task queue | {agent_mb:.0f} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child-control":
        asyncio.run(control(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    asyncio.run(main(parser.parse_args().nodes))
