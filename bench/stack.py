"""The stack the end-to-end benchmarks start for themselves, and what they do with it.

`Stack` is an embedded PostgreSQL and a Temporal dev server on loopback. On it a benchmark applies a fleet
(`load_fleet`), runs its workers (`run_workers`: the control worker in the benchmark's process or in processes of
their own, the simulated hosts' agents in another process, behind the node gateway in a third, as real hosts run
them), starts and releases allocations as the API does, and reads what each process spent (`CpuMeter`). Everything
it started ends with `shutdown` (or `close`, when no worker runs in the benchmark's process).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker, WorkflowRunner

import worker
from api.app import create_app
from bench.cpu import cpu_seconds, process_tree
from bench.fleets import bench_fleet
from bench.polling import settled, until
from contracts.placement import PlacementRequest
from contracts.task_queues import Queues
from devstack.parts import api_command
from devstack.ports import free_port
from devstack.postgres import EmbeddedPostgres
from devstack.ready import is_marked_ready
from devstack.reports import report_hosts
from devstack.temporal import DevTemporal
from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.db import create_engine, session_factory
from store.migrate import upgrade
from store.tokens import create_token
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import AllocationInput, QueueWait, Timing
from workflows.allocation.revisions import REVISION

# Simulated hosts boot at once: a benchmark's allocation waits for Berth, not for a boot.
FAST = Timing(agent_pickup_seconds=10, readiness_poll_seconds=0.05, readiness_window_seconds=0.5)


class Stack:
    """PostgreSQL and Temporal, started here; the workers and agent processes a benchmark runs on them."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.postgres = EmbeddedPostgres(home / "pg", durable=False).start()
        self.temporal = DevTemporal(home / "temporal").start()
        self.workers: list[Worker] = []
        self.agent_hosts: list[subprocess.Popen[str]] = []
        self.gateways: list[subprocess.Popen[bytes]] = []
        self.control_hosts: list[tuple[subprocess.Popen[str], Path]] = []  # (process, its lock-times file)
        self.workflow_runner: WorkflowRunner | None = None  # the in-process control worker's; None: Berth's own

    async def connect(self) -> None:
        self.client = await Client.connect(self.temporal.address, data_converter=pydantic_data_converter)
        self.engine = create_engine(self.postgres.url, pool_size=20)
        await upgrade(self.engine)
        self.sessions = session_factory(self.engine)

    async def load_fleet(self, nodes: int, fleet: str | None = None) -> Path:
        """Apply a fleet of `nodes` hosts (`bench.fleets.bench_fleet`'s, unless `fleet` is the file's text) in place
        of the last one, and send every host's start report; the fleet file's path."""
        text_ = fleet if fleet is not None else bench_fleet(nodes)
        path = self.home / f"fleet-{nodes}.yaml"
        path.write_text(text_)
        async with self.sessions.begin() as session:
            await apply_fleet(session, parse_fleet([(str(path), text_)]), prune=True)
        await self.report(path)  # the agents' start reports
        return path

    async def report(self, fleet_file: Path) -> None:
        """Every host's report, as its agent sends one on start and then every interval (the bench's agents do
        not report): a phase longer than three intervals would otherwise find every node down."""
        await report_hosts(self.sessions, parse_fleet([(str(fleet_file), fleet_file.read_text())]))

    def stop_agents(self) -> None:
        """End this phase's agent hosts and gateways (each phase has its own queues, tokens and gateway)."""
        for process in [*self.agent_hosts, *self.gateways]:
            process.terminate()
            process.wait(30)
        self.agent_hosts.clear()
        self.gateways.clear()

    def stop_control_hosts(self) -> list[dict[str, Any]]:
        """End this phase's control worker processes; the region lock's times each of them saw."""
        for process, _ in self.control_hosts:
            process.terminate()
        times = []
        for process, times_file in self.control_hosts:
            process.wait(60)
            times.append(json.loads(times_file.read_text()))
        self.control_hosts.clear()
        return times

    async def shutdown(self) -> None:
        """Stop this process's workers, then everything `close` stops."""
        await asyncio.gather(*(w.shutdown() for w in self.workers), return_exceptions=True)
        await self.engine.dispose()
        self.close()

    def close(self) -> None:
        for control, _ in self.control_hosts:
            control.terminate()
            control.wait(30)
        for agents in self.agent_hosts:
            agents.terminate()
            agents.wait(30)
        for gateway in self.gateways:
            gateway.terminate()
            gateway.wait(30)
        self.temporal.stop()
        self.postgres.stop()


async def gateway_process(stack: Stack, fleet_file: Path, queues: Queues) -> tuple[str, Path]:
    """`berth gateway` in its own process for these queues, and a directory with a node token per host."""
    tokens = stack.home / f"{queues.control}-tokens"
    tokens.mkdir()
    nodes = [
        n.name for pool in parse_fleet([(str(fleet_file), fleet_file.read_text())]).host_pools() for n in pool.nodes
    ]
    async with stack.sessions.begin() as session:
        for node in nodes:
            (tokens / node).write_text(await create_token(session, "node", node=node, label="bench"))
    address = f"127.0.0.1:{free_port()}"
    ready = stack.home / f"{queues.control}-gateway.ready"
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BERTH_")},
        "BERTH_DATABASE_URL": stack.postgres.url,
        "BERTH_TEMPORAL_ADDRESS": stack.temporal.address,
        "BERTH_GATEWAY_LISTEN": address,
        "BERTH_NODE_TASK_QUEUE_PREFIX": queues.node_prefix,
        "BERTH_STATE_DIR": str(stack.home / "gateway-state"),
    }
    gateway = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "gateway", "--ready-file", str(ready)],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.gateways.append(gateway)

    async def serving() -> bool:
        if gateway.poll() is not None:
            raise RuntimeError(f"the node gateway exited with {gateway.returncode}")
        return is_marked_ready(ready, gateway.pid)

    await until(serving, every=0.05)
    return address, tokens


async def run_workers(
    stack: Stack, fleet_file: Path, queues: Queues, via_gateway: bool = True, control_processes: int = 0
) -> list[Worker]:
    """The control worker in this process, or `control_processes` of them each in its own process
    (`bench.control_host`); the simulated hosts' agents in another, as on real hosts, through the node gateway (a
    third process) unless `via_gateway` is False."""
    arguments = [str(fleet_file), str(stack.home / queues.control), stack.temporal.address, queues.node_prefix]
    if via_gateway:
        address, tokens = await gateway_process(stack, fleet_file, queues)
        arguments[2:] = [address, queues.node_prefix, str(tokens)]
    agents = subprocess.Popen([sys.executable, "-m", "bench.agent_host", *arguments], stdout=subprocess.PIPE, text=True)
    assert agents.stdout is not None
    await asyncio.to_thread(agents.stdout.readline)  # "ready"
    stack.agent_hosts.append(agents)
    if control_processes:
        for n in range(control_processes):
            times_file = stack.home / f"{queues.control}-{n}.lock-times.json"
            control = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.control_host",
                    stack.postgres.url,
                    stack.temporal.address,
                    queues.control,
                    str(times_file),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            stack.control_hosts.append((control, times_file))
        for control, _ in stack.control_hosts:
            assert control.stdout is not None
            await asyncio.to_thread(control.stdout.readline)  # "ready"
        return []
    workers = [worker.control_worker(stack.client, stack.sessions, queues.control, runner=stack.workflow_runner)]
    for w in workers:
        asyncio.create_task(w.run())
    stack.workers.extend(workers)
    return workers


# -- allocations, as the API starts and releases them ---------------------------------------------------------------


@dataclass
class Request:
    allocation_id: str
    tenant: str
    gpus: int


async def start(
    stack: Stack,
    queues: Queues,
    request: Request,
    wait: QueueWait | None = None,
    *,
    priority_class: str | None = None,
    revision: int = REVISION,
) -> None:
    """Start the allocation's workflow as `POST /v1/allocations` does: `wait`, when it may queue for capacity;
    `priority_class`, as the request's body names it; `revision`, the workflow's (an older one, to compare)."""
    await allocation_client.start_allocation(
        stack.client,
        AllocationInput(
            allocation_id=request.allocation_id,
            tenant=request.tenant,
            request=PlacementRequest(gpu_count=request.gpus, tenant=request.tenant),
            timing=FAST,
            queues=queues,
            queue=wait,
            request_body={"priority_class": priority_class} if priority_class else {},
        ),
        revision=revision,
    )


async def allocate(stack: Stack, queues: Queues, count: int, gpus: int) -> list[str]:
    """`count` allocations of `gpus` GPUs for tenant `bench`, started at once; their ids."""
    ids = [f"bench-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    await asyncio.gather(*(start(stack, queues, Request(i, "bench", gpus)) for i in ids))
    return ids


async def release(stack: Stack, allocation_id: str, after: float = 0.0) -> None:
    """Release it (after `after` seconds): the update is retried if it finds no worker in time."""
    await asyncio.sleep(after)
    for attempt in range(5):
        try:
            await allocation_client.release(stack.client, allocation_id)
            return
        except Exception:
            if attempt == 4:
                raise
            await asyncio.sleep(1)


async def release_all(stack: Stack, ids: list[str]) -> None:
    """Release them all at once, and wait until every one's row says `released`."""
    await asyncio.gather(*(release(stack, i) for i in ids))
    await settled(stack.sessions, ids, ("released",))


@asynccontextmanager
async def api_in_process(stack: Stack, queues: Queues, label: str) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API in this process, as a member of tenant `bench` calls it (its token on every request), once a
    control worker polls `queues`: what a client's requests cost without a server's sockets."""
    async with stack.sessions.begin() as session:
        token = await create_token(session, "member", tenant="bench", label=label)
    app = create_app(sessions=stack.sessions, temporal=stack.client, queues=queues, timing=FAST)
    await until(app.state.services.control.control_workers, every=0.05)  # a worker just started polls in a moment
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://berth", timeout=60, headers=headers) as api:
        yield api


class ApiProcess:
    """The HTTP API in a process of its own on loopback (`uvicorn --factory api.app:create_app`), as agents and
    clients reach it in production."""

    def __init__(self, database_url: str, state_dir: Path, temporal_address: str | None = None) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        environment = os.environ | {"BERTH_DATABASE_URL": database_url, "BERTH_STATE_DIR": str(state_dir)}
        if temporal_address is not None:
            environment["BERTH_TEMPORAL_ADDRESS"] = temporal_address
        self.process = subprocess.Popen([*api_command(port), "--no-access-log"], env=environment)

    async def wait(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as client:

            async def answers() -> bool:
                try:
                    return (await client.get("/openapi.json")).status_code == 200
                except httpx.TransportError:
                    return False

            await until(answers, every=0.1, timeout=60, what="the API answering")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


class CpuMeter:
    """CPU seconds used by each process of the stack: where an allocation's cost goes, and robust to a busy machine
    in a way wall-clock rates are not."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def _groups(self) -> dict[str, list[psutil.Process]]:
        hosts = [p for host, _ in self.stack.control_hosts for p in process_tree(host.pid)]
        return {
            "control": hosts or [psutil.Process()],  # the control workers' processes, or this one's
            "client": [psutil.Process()] if hosts else [],  # starting the workflows and watching them settle
            "temporal": process_tree(self.stack.temporal.process.pid if self.stack.temporal.process else None),
            "postgres": process_tree(self.stack.postgres.process.pid if self.stack.postgres.process else None),
            "agents": [p for host in self.stack.agent_hosts for p in process_tree(host.pid)],
            "gateway": [p for gateway in self.stack.gateways for p in process_tree(gateway.pid)],
        }

    def read(self) -> dict[str, float]:
        """CPU seconds per group. PostgreSQL's and Temporal's server processes also count the children they have
        reaped: a backend whose connection closed (a control worker process that ended) takes its CPU with it."""
        servers = [process.pid for process in (self.stack.postgres.process, self.stack.temporal.process) if process]
        return {name: cpu_seconds(processes, reaped_by=servers) for name, processes in self._groups().items()}
