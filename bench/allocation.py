"""Allocation benchmarks against a real Temporal dev server and a real PostgreSQL, started by the benchmark.

    python -m bench.allocation [--rounds 3] [--batch 150] [--contention 1000] [--snapshot-nodes 1000,10000]
                               [--latency 30] [--agents gateway|direct|both] [--profile]
    python -m bench.allocation --rounds 0 --latency 0 --snapshot-nodes '' --contention 1000   # the burst alone

1. Throughput: a batch of 1-GPU slice allocations driven to `active` (simulated hosts, zero boot delay), against
   baselines measured in the same run on the same server (`bench/baseline_workflow.py`): `strict`, the same
   activities and local activities as no-ops; `visibility`, the same plus the search-attribute upserts an
   allocation makes. Rounds alternate baselines and allocations; medians are reported, with the CPU each process
   of the stack spent per workflow.
   Temporal actions per workflow are counted from histories (`bench/actions.py`), to `active` and through release.
2. Latency: sequential requests on an idle stack, `POST /v1/allocations` (the API in this process) to `active`
   (its row), against the strict baseline workflow started and awaited the same way in the same run; p50 and p99.
3. Contention: many 2-GPU requests at once for far more GPUs than exist. Reports double claims (checked in SQL;
   must be 0), failed attempts and claim conflicts per allocation, allocations that failed without a reason (must
   be 0), how long decisions waited for and held the region's placement lock, the time to settle, and the CPU each
   process of the stack spent meanwhile.
4. Snapshot: the cost of building the scheduler's inventory snapshot from PostgreSQL at several fleet sizes.

The agents reach Temporal through the node gateway (`berth gateway` in its own process, each host with its own
token), as every deployment runs them; `--agents both` measures throughput and latency with the agents polling
Temporal directly too (how they ran before the gateway, issue 22), in the same run, for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

import worker
from activities.control.placement import LOCK_TIMES
from api.app import create_app
from bench.actions import Actions, count_actions, run_histories
from bench.baseline_workflow import BaselineInput, BaselineWorkflow, noop
from bench.sampler import Sampler
from contracts.task_queues import Queues
from devstack.ports import free_port
from devstack.postgres import EmbeddedPostgres
from devstack.ready import is_marked_ready
from devstack.reports import report_hosts
from devstack.temporal import DevTemporal
from fleet.loader import parse_fleet
from scheduler.request import PlacementRequest
from store.apply import apply_fleet
from store.db import create_engine, session_factory
from store.decisions import record_first_choice
from store.inventory import InventoryCache
from store.migrate import upgrade
from store.snapshot import load_snapshot
from store.tokens import create_token
from workflows import allocation_client
from workflows.allocation_messages import AllocationInput, Timing

FAST = Timing(agent_pickup_seconds=10, readiness_poll_seconds=0.05, readiness_window_seconds=0.5)


def fleet_yaml(nodes: int, gpus: int = 8) -> str:
    documents = [
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "Region",
            "metadata": {"name": "bench"},
            "spec": {"prices": {"H200": 3.0}},
        },
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": "bench"},
            "spec": {"gpuQuota": 10**6},
        },
        {
            "apiVersion": "modelplane.ai/v1alpha1",
            "kind": "InferenceClass",
            "metadata": {"name": "h200"},
            "spec": {"devices": [{"name": "gpu", "driver": "gpu.nvidia.com", "count": gpus}]},
        },
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "InferenceCluster",
            "metadata": {"name": "bench-1"},
            "spec": {
                "region": "bench",
                "nodePools": [
                    {
                        "name": "slices",
                        "className": "h200",
                        "shape": "gpu_slice",
                        "gpuProduct": "H200",
                        "nodeTemplate": {"count": nodes, "namePrefix": "b-", "gpusPerNode": gpus, "numaNodes": 2},
                    }
                ],
            },
        },
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)


class Stack:
    """PostgreSQL, Temporal, a control worker and one agent per simulated host, all in this process."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.postgres = EmbeddedPostgres(home / "pg", durable=False).start()
        self.temporal = DevTemporal(home / "temporal").start()
        self.workers: list[Worker] = []
        self.agent_hosts: list[subprocess.Popen[str]] = []
        self.gateways: list[subprocess.Popen[bytes]] = []
        self.control_hosts: list[tuple[subprocess.Popen[str], Path]] = []  # (process, its lock-times file)

    async def connect(self) -> None:
        self.client = await Client.connect(self.temporal.address, data_converter=pydantic_data_converter)
        self.engine = create_engine(self.postgres.url, pool_size=20)
        await upgrade(self.engine)
        self.sessions = session_factory(self.engine)

    async def load_fleet(self, nodes: int) -> Path:
        text_ = fleet_yaml(nodes)
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
    while not is_marked_ready(ready, gateway.pid):
        if gateway.poll() is not None:
            raise RuntimeError(f"the node gateway exited with {gateway.returncode}")
        await asyncio.sleep(0.05)
    return address, tokens


async def _run_workers(
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
    workers = [worker.control_worker(stack.client, stack.sessions, queues.control)]
    for w in workers:
        asyncio.create_task(w.run())
    stack.workers.extend(workers)
    return workers


async def _allocate(stack: Stack, queues: Queues, count: int, gpus: int) -> list[str]:
    ids = [f"bench-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    await asyncio.gather(
        *(
            allocation_client.start_allocation(
                stack.client,
                AllocationInput(
                    allocation_id=i,
                    tenant="bench",
                    request=PlacementRequest(gpu_count=gpus, tenant="bench"),
                    timing=FAST,
                    queues=queues,
                ),
            )
            for i in ids
        )
    )
    return ids


async def _settled(stack: Stack, ids: list[str], states: tuple[str, ...], limit: float = 600) -> None:
    deadline = time.monotonic() + limit
    while True:
        async with stack.sessions() as session:
            by_state = dict(
                (
                    await session.execute(
                        text("SELECT state, count(*) FROM allocations WHERE id = ANY(:ids) GROUP BY state"),
                        {"ids": ids},
                    )
                ).all()
            )
        if sum(by_state.get(s, 0) for s in states) == len(ids):
            return
        if time.monotonic() > deadline or ("failed" in by_state and "failed" not in states):
            async with stack.sessions() as session:
                reasons = (
                    await session.execute(
                        text(
                            "SELECT failure_reason, count(*) FROM allocations WHERE id = ANY(:ids) AND "
                            "state = 'failed' GROUP BY failure_reason"
                        ),
                        {"ids": ids},
                    )
                ).all()
            raise RuntimeError(f"allocations did not settle as {states}: {by_state}; failures: {reasons}")
        await asyncio.sleep(0.05)


class CpuMeter:
    """CPU seconds used by each process of the stack: where an allocation's cost goes, and robust to a busy machine
    in a way wall-clock rates are not."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def _groups(self) -> dict[str, list[psutil.Process]]:
        def tree(pid: int | None) -> list[psutil.Process]:
            if pid is None:
                return []
            try:
                root = psutil.Process(pid)
                return [root, *root.children(recursive=True)]
            except psutil.Error:
                return []

        hosts = [p for host, _ in self.stack.control_hosts for p in tree(host.pid)]
        return {
            "control": hosts or [psutil.Process()],  # the control workers' processes, or this one's
            "client": [psutil.Process()] if hosts else [],  # starting the workflows and watching them settle
            "temporal": tree(self.stack.temporal.process.pid if self.stack.temporal.process else None),
            "postgres": tree(self.stack.postgres.process.pid if self.stack.postgres.process else None),
            "agents": [p for host in self.stack.agent_hosts for p in tree(host.pid)],
            "gateway": [p for gateway in self.stack.gateways for p in tree(gateway.pid)],
        }

    def read(self) -> dict[str, float]:
        """CPU seconds per group. PostgreSQL's and Temporal's server processes also count the children they have
        reaped: a backend whose connection closed (a control worker process that ended) takes its CPU with it."""
        servers = {process.pid for process in (self.stack.postgres.process, self.stack.temporal.process) if process}
        totals: dict[str, float] = {}
        for name, processes in self._groups().items():
            seconds = 0.0
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    times = process.cpu_times()
                    seconds += times.user + times.system
                    if process.pid in servers:
                        seconds += times.children_user + times.children_system
            totals[name] = seconds
        return totals


async def _measured(meter: CpuMeter, count: int, run: Awaitable[None]) -> tuple[float, dict[str, float]]:
    """(workflows per second, CPU milliseconds per workflow by process) for one batch."""
    before, started = meter.read(), time.perf_counter()
    await run
    elapsed, after = time.perf_counter() - started, meter.read()
    return count / elapsed, {name: 1000 * (after[name] - before.get(name, 0.0)) / count for name in after}


async def _baseline_batch(stack: Stack, batch: int, shape: str) -> None:
    handles = await asyncio.gather(
        *(
            stack.client.start_workflow(
                BaselineWorkflow.run,
                BaselineInput(queue="bench.baseline", shape=shape),
                id=f"baseline-{uuid.uuid4().hex}",
                task_queue="bench.baseline",
            )
            for _ in range(batch)
        )
    )
    await asyncio.gather(*(h.result() for h in handles))


async def _released(stack: Stack, ids: list[str]) -> None:
    await asyncio.gather(*(allocation_client.release(stack.client, i) for i in ids))
    await _settled(stack, ids, ("released",))


async def _allocation_batch(stack: Stack, queues: Queues, batch: int, ids: list[str]) -> None:
    """1-GPU slice allocations driven to `active`; their ids go into `ids` for the release that follows."""
    ids.extend(await _allocate(stack, queues, batch, 1))
    await _settled(stack, ids, ("active",))


async def throughput(
    stack: Stack, rounds: int, batch: int, via_gateway: bool = True, profile: bool = False
) -> dict[str, dict[str, object]]:
    """Rounds of: a strict baseline batch, a visibility baseline batch, an allocation batch (then released)."""
    fleet_file = await stack.load_fleet(max(8, batch // 4))  # twice the GPUs the batch asks for
    tag = "gw" if via_gateway else "direct"
    queues = Queues(control=f"bench-{tag}.control", node_prefix=f"bench-{tag}.node.")
    workers = await _run_workers(stack, fleet_file, queues, via_gateway)
    baseline_worker = Worker(stack.client, task_queue="bench.baseline", workflows=[BaselineWorkflow], activities=[noop])
    asyncio.create_task(baseline_worker.run())
    stack.workers.append(baseline_worker)
    meter = CpuMeter(stack)
    sampler = Sampler()
    release_cpu: list[dict[str, float]] = []

    runs: dict[str, list[tuple[float, dict[str, float]]]] = {"strict": [], "visibility": [], "allocation": []}
    actions: list[Actions] = []
    for _ in range(rounds):
        await stack.report(fleet_file)
        for shape in ("strict", "visibility"):
            runs[shape].append(await _measured(meter, batch, _baseline_batch(stack, batch, shape)))

        ids: list[str] = []
        with sampler if profile else contextlib.nullcontext():  # the control process's time, by what it did
            runs["allocation"].append(await _measured(meter, batch, _allocation_batch(stack, queues, batch, ids)))
            released = await _measured(meter, batch, _released(stack, ids))
        release_cpu.append(released[1])
        for i in ids[:5]:
            actions.append(count_actions(await run_histories(stack.client, allocation_client.workflow_id(i))))

    for w in [*workers, baseline_worker]:
        await w.shutdown()
    stack.stop_agents()
    result: dict[str, dict[str, object]] = {}
    for name, measured in runs.items():
        rates = [rate for rate, _cpu in measured]
        result[name] = {
            "per_s": statistics.median(rates),
            "cpu_ms": {group: statistics.median(cpu[group] for _rate, cpu in measured) for group in measured[0][1]},
        }
    for name in ("strict", "visibility"):
        result[name]["ratio"] = statistics.median(
            a / b for (a, _), (b, _) in zip(runs["allocation"], runs[name], strict=True)
        )
    # The control process's CPU per allocation, placement and release together, shared out by the samples (an
    # in-process control worker only: its own process's CPU is what the samples divide).
    control = statistics.median(cpu["control"] for _rate, cpu in runs["allocation"])
    control += statistics.median(cpu["control"] for cpu in release_cpu)
    result["profile"] = {"control_ms": control, "split": sampler.split(control) if not stack.control_hosts else {}}
    result["actions"] = {
        "to_active": statistics.median(Actions.count(a.to_active) for a in actions),
        "total": statistics.median(Actions.count(a.total) for a in actions),
        "max_to_active": max(Actions.count(a.to_active) for a in actions),
        "node_steps": statistics.median(a.to_active["activity"] for a in actions),
    }
    return result


async def _row_state(stack: Stack, allocation_id: str, wanted: str, limit: float = 60) -> None:
    """Poll the allocation's row (what `GET /v1/allocations/{id}` answers) every 2 ms until it is `wanted`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        async with stack.sessions() as session:
            state = await session.scalar(text("SELECT state FROM allocations WHERE id = :i"), {"i": allocation_id})
        if state == wanted:
            return
        await asyncio.sleep(0.002)
    raise RuntimeError(f"allocation {allocation_id} did not become {wanted} in {limit:.0f}s")


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]}


async def latency(stack: Stack, count: int, via_gateway: bool = True) -> dict[str, dict[str, float]]:
    """Sequential, on an idle stack: POST /v1/allocations -> `active`, and the strict baseline started -> completed,
    interleaved one for one so both see the same machine. Milliseconds."""
    fleet_file = await stack.load_fleet(8)
    tag = "gw" if via_gateway else "direct"
    queues = Queues(control=f"latency-{tag}.control", node_prefix=f"latency-{tag}.node.")
    workers = await _run_workers(stack, fleet_file, queues, via_gateway)
    baseline_worker = Worker(
        stack.client, task_queue="latency.baseline", workflows=[BaselineWorkflow], activities=[noop]
    )
    asyncio.create_task(baseline_worker.run())
    async with stack.sessions.begin() as session:
        token = await create_token(session, "member", tenant="bench", label="latency")
    app = create_app(sessions=stack.sessions, temporal=stack.client, queues=queues, timing=FAST)
    while await app.state.services.control.control_workers() == 0:  # a worker just started polls in a moment
        await asyncio.sleep(0.05)
    transport = httpx.ASGITransport(app=app)
    samples: dict[str, list[float]] = {"allocation": [], "strict": []}
    async with httpx.AsyncClient(transport=transport, base_url="http://berth", timeout=60) as api:
        headers = {"Authorization": f"Bearer {token}"}
        for n in range(count + 2):  # the first two warm both paths up and are not counted
            started = time.perf_counter()
            response = await api.post("/v1/allocations", json={"gpu_count": 1}, headers=headers)
            assert response.status_code == 202, response.text
            allocation_id = response.json()["id"]
            await _row_state(stack, allocation_id, "active")
            took = 1000 * (time.perf_counter() - started)
            await allocation_client.release(stack.client, allocation_id)
            await _row_state(stack, allocation_id, "released")

            started = time.perf_counter()
            handle = await stack.client.start_workflow(
                BaselineWorkflow.run,
                BaselineInput(queue="latency.baseline", shape="strict"),
                id=f"baseline-{uuid.uuid4().hex}",
                task_queue="latency.baseline",
            )
            await handle.result()
            if n >= 2:
                samples["allocation"].append(took)
                samples["strict"].append(1000 * (time.perf_counter() - started))
    for w in [*workers, baseline_worker]:
        await w.shutdown()
    stack.stop_agents()
    return {name: _percentiles(values) for name, values in samples.items()}


async def _record_round_trips(sessions: async_sessionmaker[AsyncSession], count: int = 200) -> list[float]:
    """The first-choice statement alone, one at a time, commit included: the region lock's hold seen from outside
    (milliseconds; it writes nothing, the allocation does not exist)."""
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        await record_first_choice(sessions, "bench", "bench-no-such-allocation", "no-such-node", seen=[])
        samples.append(1000 * (time.perf_counter() - began))
    return samples


async def _durable_record_round_trips(home: Path) -> list[float]:
    """The same on a PostgreSQL that flushes its WAL at each commit (fsync on), as production runs it."""
    postgres = EmbeddedPostgres(home / "pg-durable", durable=True).start()
    engine = create_engine(postgres.url)
    try:
        await upgrade(engine)
        return await _record_round_trips(session_factory(engine))
    finally:
        await engine.dispose()
        postgres.stop()


async def contention(stack: Stack, requests: int, control_processes: int = 0) -> dict[str, Any]:
    """The burst: `requests` x 2 GPUs at once for 400 GPUs, decided by the control worker in this process or by
    `control_processes` control workers each in its own process."""
    fleet_file = await stack.load_fleet(50)  # 400 GPUs for 2,000 requested
    tag = f"-{control_processes}p" if control_processes else ""
    queues = Queues(control=f"contention{tag}.control", node_prefix=f"contention{tag}.node.")
    workers = await _run_workers(stack, fleet_file, queues, control_processes=control_processes)
    LOCK_TIMES.clear()
    meter = CpuMeter(stack)
    cpu_before, started = meter.read(), time.perf_counter()
    ids = await _allocate(stack, queues, requests, 2)
    all_started = time.perf_counter() - started
    await _settled(stack, ids, ("active", "failed"))
    elapsed, cpu_after = time.perf_counter() - started, meter.read()
    async with stack.sessions() as session:
        doubled = await session.scalar(
            text(
                "SELECT count(*) FROM (SELECT slot_id FROM allocation_resource_claims WHERE released_at IS NULL "
                "GROUP BY slot_id HAVING count(*) > 1) d"
            )
        )
        failed_attempts = await session.scalar(
            text("SELECT count(*) FROM allocation_events WHERE step = 'attempt_failed' AND allocation_id = ANY(:ids)"),
            {"ids": ids},
        )
        conflicts = await session.scalar(
            text(
                "SELECT count(*) FROM allocation_events WHERE step = 'attempt_failed' AND reason LIKE 'claim_conflict%' "
                "AND allocation_id = ANY(:ids)"
            ),
            {"ids": ids},
        )
        active = await session.scalar(
            text("SELECT count(*) FROM allocations WHERE state = 'active' AND id = ANY(:ids)"), {"ids": ids}
        )
        unexplained = await session.scalar(
            text(
                "SELECT count(*) FROM allocations WHERE state = 'failed' AND coalesce(failure_reason, '') = '' "
                "AND id = ANY(:ids)"
            ),
            {"ids": ids},
        )
        reasons = dict(
            (
                await session.execute(
                    text(
                        "SELECT split_part(failure_reason, ':', 1), count(*) FROM allocations WHERE state = 'failed' "
                        "AND id = ANY(:ids) GROUP BY 1"
                    ),
                    {"ids": ids},
                )
            ).all()
        )
    async with stack.sessions() as session:
        holding = (
            (
                await session.execute(
                    text("SELECT id FROM allocations WHERE state = 'active' AND id = ANY(:ids)"), {"ids": ids}
                )
            )
            .scalars()
            .all()
        )
    await asyncio.gather(*(allocation_client.release(stack.client, i) for i in holding))
    await _settled(stack, list(holding), ("released",))
    for w in workers:
        await w.shutdown()
    times = stack.stop_control_hosts() or [
        {
            "held": list(LOCK_TIMES.held),
            "waited": list(LOCK_TIMES.waited),
            "fast_refusals": LOCK_TIMES.fast_refusals,
            "moved": LOCK_TIMES.moved,
            "unchecked": LOCK_TIMES.unchecked,
        }
    ]
    stack.stop_agents()
    round_trips = await _record_round_trips(stack.sessions)
    held_all = [ms for t in times for ms in t["held"]]
    waited_all = [ms for t in times for ms in t["waited"]]
    held, waited = _percentiles(held_all or [0.0]), _percentiles(waited_all or [0.0])
    return {
        "requests": requests,
        "active": active,
        "double_claims": doubled,
        "failed_attempts_per_allocation": failed_attempts / requests,
        "claim_conflicts_per_allocation": conflicts / requests,
        "settle_seconds": elapsed,
        "started_seconds": all_started,  # the start_workflow calls all answered
        "cpu_seconds": {group: cpu_after[group] - cpu_before.get(group, 0.0) for group in cpu_after},
        "failed_without_reason": unexplained,
        "failure_reasons": reasons,
        "lock": {
            "records": len(held_all),  # each try to record a first choice took the lock once
            # tries that found the chosen node filled since the read (planned, set aside or claimed by others)
            "moved": sum(t["moved"] for t in times),
            "unchecked": sum(t["unchecked"] for t in times),
            "fast_refusals": sum(t["fast_refusals"] for t in times),
            "held_p50": held["p50"],
            "held_p99": held["p99"],
            "waited_p50": waited["p50"],
            "waited_p99": waited["p99"],
            "idle_round_trip_p50": statistics.median(round_trips),
            "durable_round_trip_p50": statistics.median(await _durable_record_round_trips(stack.home)),
        },
    }


async def snapshot_cost(stack: Stack, sizes: list[int], runs: int = 5) -> list[tuple[int, float, float]]:
    """(nodes, full read ms, cached read ms): the snapshot read whole from PostgreSQL, and from a control worker's
    `InventoryCache` when the fleet has not changed (only claims, slot states, usage and plans are read)."""
    results = []
    for size in sizes:
        await stack.load_fleet(size)
        cache = InventoryCache()
        full, cached = [], []
        for _ in range(runs):
            async with stack.sessions() as session:
                started = time.perf_counter()
                await load_snapshot(session)
                full.append((time.perf_counter() - started) * 1000)
                await cache.snapshot(session)  # warm
                started = time.perf_counter()
                await cache.snapshot(session)
                cached.append((time.perf_counter() - started) * 1000)
        results.append((size, statistics.median(full), statistics.median(cached)))
    return results


async def _print_throughput(stack: Stack, args: argparse.Namespace, via_gateway: bool) -> None:
    result = await throughput(stack, args.rounds, args.batch, via_gateway, args.profile)
    allocation = result["allocation"]
    print(f"\nagents {'through the node gateway' if via_gateway else 'polling Temporal directly'}:")
    print("\n| baseline | baseline wf/s | allocations to active /s | ratio (median of rounds) |")
    print("|---|---:|---:|---:|")
    for name in ("strict", "visibility"):
        print(f"| {name} | {result[name]['per_s']:.1f} | {allocation['per_s']:.1f} | {result[name]['ratio']:.2f} |")
    print(
        "\n| workflow | CPU ms per workflow: control process | Temporal server | node agents | node gateway "
        "| PostgreSQL | total |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("strict", "visibility", "allocation"):
        cpu = result[name]["cpu_ms"]
        groups = ("control", "temporal", "agents", "gateway", "postgres")
        cells = " | ".join(f"{max(cpu[g], 0.0):.0f}" for g in groups)  # type: ignore[index]
        print(f"| {name} | {cells} | {sum(max(cpu[g], 0.0) for g in groups):.0f} |")  # type: ignore[index]
    profile = result["profile"]
    if profile["split"]:
        print(
            f"\nThe control process's CPU per allocation, placement and release: {profile['control_ms']:.1f} ms, "
            "by what it was doing (bench/sampler.py)\n"
        )
        print("| doing | ms per allocation |\n|---|---:|")
        for label, ms in profile["split"].items():  # type: ignore[union-attr]
            print(f"| {label} | {ms:.2f} |")
    a = result["actions"]
    print(
        f"\nTemporal actions per allocation (median of {args.rounds * 5} histories): to active "
        f"{a['to_active']:g} (max {a['max_to_active']:g}), through release {a['total']:g}"
    )
    # Each part's CPU to `active` by the unit of work it does: the server per action, the gateway and the agents
    # per node step (a poll answered and its completion through the gateway; the step run by the agent).
    cpu, steps = allocation["cpu_ms"], max(a["node_steps"], 1)
    print("\n| part | CPU ms per allocation to active | per unit of its work |\n|---|---:|---|")
    print(
        f"| Temporal server | {cpu['temporal']:.0f} | {cpu['temporal'] / a['to_active']:.1f} per action "
        f"({a['to_active']:g}) |"
    )
    print(f"| node gateway | {cpu['gateway']:.0f} | {cpu['gateway'] / steps:.1f} per node step ({steps:g}) |")
    print(f"| node agents | {cpu['agents']:.0f} | {cpu['agents'] / steps:.1f} per node step ({steps:g}) |")
    print(f"| PostgreSQL | {cpu['postgres']:.0f} | |")
    print(f"| control process (the benchmark's client included) | {cpu['control']:.0f} | |")


def _print_contention(c: dict[str, Any]) -> None:
    print(
        "\n| requests | active | double claims | failed attempts / allocation | claim conflicts / allocation | settle s |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {c['requests']} | {c['active']} | {c['double_claims']} | {c['failed_attempts_per_allocation']:.2f} | "
        f"{c['claim_conflicts_per_allocation']:.3f} | {c['settle_seconds']:.1f} |"
    )
    cpu = c["cpu_seconds"]
    print(
        f"\nall {c['requests']} started in {c['started_seconds']:.1f} s; CPU seconds while settling: "
        + ", ".join(f"{group} {seconds:.1f}" for group, seconds in cpu.items())
    )
    lock = c["lock"]
    print(f"\nfailed without a reason: {c['failed_without_reason']}; failure reasons: {c['failure_reasons']}")
    print(
        f"region lock: {lock['records']} records took it ({lock['moved']} found their node filled since the read "
        f"and ranked again, {lock['unchecked']} recorded unchecked), "
        f"{lock['fast_refusals']} requests refused before it; "
        f"held p50 {lock['held_p50']:.2f} ms, p99 {lock['held_p99']:.2f} ms; "
        f"waited p50 {lock['waited_p50']:.2f} ms, p99 {lock['waited_p99']:.2f} ms; the record statement's round "
        f"trip on the idle stack, commit included, p50 {lock['idle_round_trip_p50']:.2f} ms (the benchmark's "
        f"PostgreSQL runs with fsync off), with fsync on {lock['durable_round_trip_p50']:.2f} ms"
    )


async def scaled_throughput(stack: Stack, batch: int, rounds: int, control_processes: int) -> dict[str, Any]:
    """Batches of 1-GPU allocations driven to `active` by `control_processes` control workers (each its own
    process): the median rate of the rounds, and the CPU each group spent per allocation."""
    fleet_file = await stack.load_fleet(max(8, batch // 4))  # twice the GPUs the batch asks for
    queues = Queues(control=f"scale-{control_processes}p.control", node_prefix=f"scale-{control_processes}p.node.")
    await _run_workers(stack, fleet_file, queues, control_processes=control_processes)
    meter = CpuMeter(stack)
    measured = []
    for _ in range(rounds):
        await stack.report(fleet_file)
        ids: list[str] = []
        measured.append(await _measured(meter, batch, _allocation_batch(stack, queues, batch, ids)))
        await asyncio.gather(*(allocation_client.release(stack.client, i) for i in ids))
        await _settled(stack, ids, ("released",))
    stack.stop_control_hosts()
    stack.stop_agents()
    return {
        "per_s": statistics.median(rate for rate, _ in measured),
        "rates": [rate for rate, _ in measured],
        "cpu_ms": {group: statistics.median(cpu[group] for _, cpu in measured) for group in measured[0][1]},
    }


async def _print_scale_out(stack: Stack, args: argparse.Namespace) -> None:
    """The same throughput batches and burst with each number of control worker processes, in this one run."""
    counts = [int(n) for n in args.control_workers.split(",")]
    for n in counts:
        print(f"\n### {n} control worker process(es)")
        if args.rounds:
            t = await scaled_throughput(stack, args.batch, args.rounds, n)
            rates = ", ".join(f"{r:.1f}" for r in t["rates"])
            cpu = ", ".join(f"{group} {ms:.0f}" for group, ms in t["cpu_ms"].items() if ms > 0)
            print(
                f"\nallocations to active per second: median {t['per_s']:.1f} ({rates}); CPU ms per allocation: {cpu}"
            )
        if args.contention:
            _print_contention(await contention(stack, args.contention, control_processes=n))


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as home:
        stack = Stack(Path(home))
        try:
            await stack.connect()
            modes = {"gateway": [True], "direct": [False], "both": [False, True]}[args.agents]
            for via_gateway in modes if args.rounds else ():
                await _print_throughput(stack, args, via_gateway)
            for via_gateway in modes if args.latency else ():
                lat = await latency(stack, args.latency, via_gateway)
                print(f"\n| sequential, idle, agents {'via gateway' if via_gateway else 'direct'} | p50 ms | p99 ms |")
                print("|---|---:|---:|")
                print(
                    f"| POST /v1/allocations -> active | {lat['allocation']['p50']:.0f} | {lat['allocation']['p99']:.0f} |"
                )
                print(f"| strict baseline start -> done | {lat['strict']['p50']:.0f} | {lat['strict']['p99']:.0f} |")
                print(f"| ratio of p50 | {lat['allocation']['p50'] / lat['strict']['p50']:.2f} | |")
            if args.contention and not args.control_workers:
                _print_contention(await contention(stack, args.contention))
            if args.control_workers:
                await _print_scale_out(stack, args)
            sizes = [int(s) for s in args.snapshot_nodes.split(",") if s]
            print("\n| nodes | slots | snapshot read whole, median ms | from the inventory cache, median ms |")
            print("|---:|---:|---:|---:|")
            for size, full, cached in await snapshot_cost(stack, sizes):
                print(f"| {size} | {size * 8} | {full:.0f} | {cached:.1f} |")
        finally:
            await stack.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (0: skip)")
    parser.add_argument("--batch", type=int, default=150)
    parser.add_argument("--contention", type=int, default=1000, help="requests in the burst (0: skip)")
    parser.add_argument("--snapshot-nodes", default="1000,10000")
    parser.add_argument("--latency", type=int, default=30, help="sequential requests (0: skip)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="split the control process's CPU per allocation by what it was doing (bench/sampler.py; samples "
        "every 5 ms, so the throughput figures of a profiled run are not compared with an unprofiled one's)",
    )
    parser.add_argument(
        "--control-workers",
        default="",
        help="e.g. 1,3: run the throughput batches (--rounds x --batch) and the burst (--contention) with that many "
        "control worker processes each, in this run, instead of the in-process worker's burst",
    )
    parser.add_argument(
        "--agents",
        choices=("gateway", "direct", "both"),
        default="gateway",
        help="how agents reach Temporal in the throughput and latency phases (both: a before/after in one run)",
    )
    asyncio.run(main(parser.parse_args()))
