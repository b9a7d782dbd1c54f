"""Resident memory of a control worker holding a large inventory, and of a node agent (targets: 300 MB at 10,000
nodes, 80 MB for an agent).

    python -m bench.memory [--nodes 10000] [--trace] [--control-only]

Starts PostgreSQL and a Temporal dev server on loopback, applies a fleet of `--nodes` 8-GPU hosts, then measures
in processes of their own, as they run in production:
- a control worker (`worker.control_worker`, polling) before and after its `InventoryCache` holds the whole
  inventory (the snapshot every placement decision starts from); `--trace` also prints, from a second child run
  under tracemalloc, where the inventory's memory was allocated (file:line; tracemalloc's own overhead inflates
  that run's RSS, so its figures are not the table's);
- one node agent as a platform team runs it on a GPU host: the `berth` command itself, `berth worker node
  --node-id N --api URL --token T`, on the simulated topology and runtime from a one-host fleet file, reporting to
  the API (`uvicorn --factory api.app:create_app`, started here as `bench.agent_reports` does) with its node token;
- the same command with the real topology (sysfs of the HGX fixture host, `tests/hosts`) and the libvirt runtime
  on libvirt's test driver (`--libvirt-uri test:///tests/hosts/libvirt/host.xml`), when libvirt-python is there;
- `bench.agent_host` serving one simulated host (what `bench.allocation` runs for its hosts; no reporter).

An agent is measured once its task queue has its poller (Temporal's DescribeTaskQueue) and its first report is in
PostgreSQL (its `node_agents.seen_at` moved), after a few seconds more of serving. Each row gives RSS (the target's
measure), USS (what the process alone holds: RSS counts the pages of shared libraries too) and the peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import yaml
from sqlalchemy import select, text
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

import worker
from bench.fleets import bench_fleet
from bench.polling import until
from bench.stack import ApiProcess, Stack, gateway_process
from contracts.task_queues import Queues
from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.db import create_engine, session_factory
from store.inventory import InventoryCache
from store.models import NodeAgentRow

REPO = Path(__file__).resolve().parent.parent
LIBVIRT_HOST = REPO / "tests" / "hosts" / "libvirt" / "host.xml"
NODE_QUEUE_PREFIX = "memory.node."


SETTLE_SECONDS = 5.0  # serving on after the first report before the figure is read: the reporter's next check


@dataclass(frozen=True)
class Memory:
    """A process's memory, in MB: resident (RSS, the target's measure), private (USS: the resident pages no other
    process shares, what one more such process costs), and its resident high-water mark so far (VmHWM)."""

    rss: float
    private: float
    peak: float

    @classmethod
    def of(cls, pid: int | None = None) -> Memory:
        process = psutil.Process(pid)
        full = process.memory_full_info()
        peak = float("nan")
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
        return cls(rss=full.rss / 2**20, private=full.uss / 2**20, peak=peak / 2**20)

    def row(self, what: str) -> str:
        return f"| {what} | {self.rss:.0f} | {self.private:.0f} | {self.peak:.0f} |"

    def words(self) -> str:
        return f"{self.rss} {self.private} {self.peak}"

    @classmethod
    def parse(cls, words: Sequence[str]) -> Memory:
        return cls(*(float(word) for word in words))


# --- the control worker (a child process) -------------------------------------------------------------------------


async def control(database_url: str, address: str, trace: bool) -> None:
    """The child: a polling control worker, then the inventory loaded into a cache of the kind it keeps. With `trace`,
    tracemalloc runs from the start and the largest allocation sites of the inventory load are printed after."""
    if trace:
        tracemalloc.start(1)
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    engine = create_engine(database_url, pool_size=5)
    sessions = session_factory(engine)
    control_worker = worker.control_worker(client, sessions, "memory.control")
    running = asyncio.create_task(control_worker.run())
    await asyncio.sleep(2)
    gc.collect()
    idle = Memory.of()
    before = tracemalloc.take_snapshot() if trace else None
    cache = InventoryCache()
    async with sessions() as session:
        snapshot = await cache.snapshot(session)
    gc.collect()
    slots = sum(len(n.slots) for n in snapshot.nodes.values())
    print(f"{idle.words()} {Memory.of().words()} {len(snapshot.nodes)} {slots}", flush=True)
    if before is not None:
        grown = tracemalloc.take_snapshot().compare_to(before, "lineno")
        total = sum(stat.size_diff for stat in grown)
        print(f"tracemalloc: {total / 2**20:.1f} MB more Python memory held after the load; largest sites:")
        for stat in grown[:25]:
            frame = stat.traceback[0]
            where = f"{os.path.relpath(frame.filename, REPO)}:{frame.lineno}"
            print(f"  {stat.size_diff / 2**20:8.1f} MB  {stat.count_diff:>9,} blocks  {where}")
    await control_worker.shutdown()
    await running
    await engine.dispose()


def _control_child(stack: Stack, trace: bool) -> list[str]:
    command = [sys.executable, "-m", "bench.memory", "--child-control", stack.postgres.url, stack.temporal.address]
    out = subprocess.run([*command, *(["--trace"] if trace else [])], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


# --- node agents (each the `berth` command, a child process) ------------------------------------------------------


def _berth() -> list[str]:
    """The installed `berth` console script beside this interpreter (what a host runs), else its module."""
    script = Path(sys.executable).with_name("berth")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cli.main"]


def one_host_fleet(nodes: int) -> tuple[str, str]:
    """A fleet file of just the bench fleet's last host, with the same name and hardware (a template of one host
    starting at its index), and that host's name."""
    text_ = bench_fleet(1, first_index=nodes)
    (host,) = [n.name for p in parse_fleet([("one.yaml", text_)]).host_pools() for n in p.nodes]
    return text_, host


async def _polled(client: Client, task_queue: str) -> bool:
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    return len(response.pollers) > 0


async def _reported_since(stack: Stack, node: str, since: datetime) -> bool:
    async with stack.sessions() as session:
        seen = await session.scalar(select(NodeAgentRow.seen_at).where(NodeAgentRow.node == node))
    return seen is not None and seen > since


async def measure_agent(
    stack: Stack, command: Sequence[str], node: str, environment: dict[str, str], log: Path
) -> Memory:
    """Start an agent, wait until it serves `NODE_QUEUE_PREFIX + node` and its first report is in, let it serve a
    few seconds more, and read its memory."""
    async with stack.sessions() as session:
        since = await session.scalar(text("SELECT now()"))
    with log.open("w") as output:
        agent = subprocess.Popen(command, env=os.environ | environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        queue = f"{NODE_QUEUE_PREFIX}{node}"

        async def serving() -> bool:
            if agent.poll() is not None:
                raise RuntimeError(f"{' '.join(command[:4])} ... exited {agent.returncode}: {log.read_text()[-2000:]}")
            return await _polled(stack.client, queue) and await _reported_since(stack, node, since)

        async def log_tail() -> str:
            return log.read_text()[-2000:]

        await until(
            serving, every=0.2, timeout=120, what=f"the agent for {node} serving and reporting", detail=log_tail
        )
        await asyncio.sleep(SETTLE_SECONDS)
        return Memory.of(agent.pid)
    finally:
        agent.terminate()
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
            raise RuntimeError(f"the agent did not stop on SIGTERM: {log.read_text()[-3000:]}") from None


async def _through_gateway(stack: Stack, fleet_file: Path, node: str, name: str) -> tuple[str, dict[str, str]]:
    """A node gateway (its own process) for the agent of `node`: the agent's --token-file and its environment."""
    address, tokens = await gateway_process(stack, fleet_file, Queues(control=name, node_prefix=NODE_QUEUE_PREFIX))
    return str(tokens / node), {"BERTH_NODE_GATEWAY": address}


async def simulated_agent(stack: Stack, home: Path, nodes: int, api: ApiProcess) -> Memory:
    """`berth worker node` on the simulated topology and runtime of the bench fleet's last host, reporting."""
    fleet_text, node = one_host_fleet(nodes)
    fleet_file = home / "one.yaml"
    fleet_file.write_text(fleet_text)
    token_file, gateway = await _through_gateway(stack, fleet_file, node, "memory-simulated")
    command = [
        *_berth(),
        "worker",
        "node",
        "--node-id",
        node,
        "--fleet",
        str(fleet_file),
        "--api",
        api.url,
        "--token-file",
        token_file,
    ]
    environment = _agent_environment(stack, home / "agent") | gateway
    return await measure_agent(stack, command, node, environment, home / "agent.log")


async def libvirt_agent(stack: Stack, home: Path, api: ApiProcess) -> Memory | str:
    """`berth worker node --topology host --runtime libvirt` on the HGX fixture host's sysfs and libvirt's test
    driver, reporting; or why it was not measured."""
    try:
        import libvirt  # noqa: F401 - only whether the `host` extra is installed

        from tests.hosts.materialise import fixture_fleet
        from tests.hosts.sysfs_tree import hgx_h200
    except ImportError as missing:
        return f"not measured: {missing}"
    host = hgx_h200()
    root = host.write(home / "hgx")
    fleet_text = fixture_fleet([host.node])
    async with stack.sessions.begin() as session:  # beside the bench fleet, which stays as it is
        await apply_fleet(session, parse_fleet([("fixture.yaml", fleet_text)]), prune=False)
    fixture_file = home / "fixture.yaml"
    fixture_file.write_text(fleet_text)
    token_file, gateway = await _through_gateway(stack, fixture_file, host.name, "memory-libvirt")
    catalogue = home / "images.yaml"
    base = "/var/lib/berth/pool/ubuntu-24.04.qcow2"  # the base image host.xml's storage pool holds
    catalogue.write_text(yaml.safe_dump({"images": {"ubuntu-24.04": base}, "default": "ubuntu-24.04"}))
    command = [
        *_berth(),
        "worker",
        "node",
        "--node-id",
        host.name,
        "--topology",
        "host",
        "--host-root",
        str(root),
        "--runtime",
        "libvirt",
        "--libvirt-uri",
        f"test://{LIBVIRT_HOST}",
        "--storage-pool",
        "berth",
        "--network",
        "berth-net",
        "--image-catalogue",
        str(catalogue),
        "--api",
        api.url,
        "--token-file",
        token_file,
    ]
    environment = _agent_environment(stack, home / "libvirt-agent") | gateway
    return await measure_agent(stack, command, host.name, environment, home / "libvirt-agent.log")


async def agent_host(stack: Stack, home: Path, nodes: int) -> Memory:
    """`bench.agent_host` serving the bench fleet's last host (no reporter): its memory 2 s after it says ready."""
    fleet_text, _ = one_host_fleet(nodes)
    fleet_file = home / "one-agent-host.yaml"
    fleet_file.write_text(fleet_text)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.agent_host",
            str(fleet_file),
            str(home / "agent-host"),
            stack.temporal.address,
            NODE_QUEUE_PREFIX,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        await asyncio.to_thread(agent.stdout.readline)  # "ready"
        await asyncio.sleep(2)
        return Memory.of(agent.pid)
    finally:
        agent.terminate()
        agent.wait(30)


def _agent_environment(stack: Stack, state_dir: Path) -> dict[str, str]:
    del stack  # an agent knows the API and the node gateway (given with the command), nothing else of the stack
    return {
        "BERTH_STATE_DIR": str(state_dir),
        "BERTH_NODE_TASK_QUEUE_PREFIX": NODE_QUEUE_PREFIX,
        "BERTH_REPORT_INTERVAL_SECONDS": "60",
    }


# --- the run --------------------------------------------------------------------------------------------------------


async def main(nodes: int, trace: bool, control_only: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-memory-") as directory:
        home = Path(directory)
        stack = Stack(home)
        api: ApiProcess | None = None
        try:
            await stack.connect()
            started = time.monotonic()
            await stack.load_fleet(nodes)
            print(f"{nodes} hosts applied in {time.monotonic() - started:.0f} s")
            out = _control_child(stack, trace=False)[0].split()
            idle, loaded, held_nodes, held_slots = Memory.parse(out[0:3]), Memory.parse(out[3:6]), out[6], out[7]
            traced = _control_child(stack, trace=True)[1:] if trace else []
            if control_only:
                _print_control(idle, loaded, held_nodes, held_slots, traced)
                return

            api = ApiProcess(stack.postgres.url, home / "api", stack.temporal.address)
            await api.wait()
            simulated = await simulated_agent(stack, home, nodes, api)
            libvirt = await libvirt_agent(stack, home, api)
            bench_host = await agent_host(stack, home, nodes)
        finally:
            if api is not None:
                api.stop()
            await stack.engine.dispose()
            stack.close()
    serving = "serving, first report answered"
    _print_control(idle, loaded, held_nodes, held_slots, [])
    print(simulated.row(f"`berth worker node`, simulated host, {serving}"))
    if isinstance(libvirt, str):
        print(f"| `berth worker node --topology host --runtime libvirt` | {libvirt} | | |")
    else:
        print(libvirt.row(f"`berth worker node --topology host --runtime libvirt` (test driver), {serving}"))
    print(bench_host.row("`bench.agent_host`, one simulated host, no reporter"))
    if traced:
        print("\n" + "\n".join(traced))


def _print_control(idle: Memory, loaded: Memory, held_nodes: str, held_slots: str, traced: list[str]) -> None:
    print("\n| process | RSS MB | private (USS) MB | peak RSS MB |")
    print("|---|---:|---:|---:|")
    print(idle.row("control worker, polling, no inventory yet"))
    print(loaded.row(f"control worker holding {int(held_nodes):,} nodes / {int(held_slots):,} slots"))
    if traced:
        print("\n" + "\n".join(traced))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--child-control":
        asyncio.run(control(sys.argv[2], sys.argv[3], trace="--trace" in sys.argv[4:]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--trace", action="store_true", help="where the inventory's memory goes (tracemalloc)")
    parser.add_argument("--control-only", action="store_true", help="the control worker alone, no agents")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.nodes, arguments.trace, arguments.control_only))
