"""Allocation benchmarks against a real Temporal dev server and a real PostgreSQL, started by the benchmark.

    python -m bench.allocation [--rounds 3] [--batch 150] [--contention 1000] [--snapshot-nodes 1000,10000]
                               [--latency 30] [--agents gateway|direct|both] [--profile]
                               [--sandbox as-shipped|passthrough-all|none]
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
Temporal directly too (how they ran before the node gateway), in the same run, for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import worker
from activities.control.placement import LOCK_TIMES
from bench.actions import Actions, count_actions, run_histories
from bench.baseline_workflow import BaselineInput, BaselineWorkflow, noop
from bench.control_host import lock_times
from bench.database import embedded_database
from bench.polling import settled
from bench.sampler import Sampler
from bench.stack import CpuMeter, Stack, allocate, api_in_process, release_all, run_workers
from bench.stats import p50_p99
from contracts.task_queues import Queues
from store.decisions import record_first_choice
from store.inventory import InventoryCache
from store.snapshot import load_snapshot
from workflows.allocation import client as allocation_client


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


async def _allocation_batch(stack: Stack, queues: Queues, batch: int, ids: list[str]) -> None:
    """1-GPU slice allocations driven to `active`; their ids go into `ids` for the release that follows."""
    ids.extend(await allocate(stack, queues, batch, 1))
    await settled(stack.sessions, ids, ("active",))


async def throughput(
    stack: Stack, rounds: int, batch: int, via_gateway: bool = True, profile: bool = False
) -> dict[str, dict[str, object]]:
    """Rounds of: a strict baseline batch, a visibility baseline batch, an allocation batch (then released)."""
    fleet_file = await stack.load_fleet(max(8, batch // 4))  # twice the GPUs the batch asks for
    tag = "gw" if via_gateway else "direct"
    queues = Queues(control=f"bench-{tag}.control", node_prefix=f"bench-{tag}.node.")
    workers = await run_workers(stack, fleet_file, queues, via_gateway)
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
            released = await _measured(meter, batch, release_all(stack, ids))
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


async def _row_reads(stack: Stack, allocation_id: str, wanted: str) -> None:
    """Read the allocation's row (what `GET /v1/allocations/{id}` answers) every 2 ms until it says `wanted`."""
    await settled(stack.sessions, [allocation_id], (wanted,), every=0.002, timeout=60)


async def latency(stack: Stack, count: int, via_gateway: bool = True) -> dict[str, dict[str, float]]:
    """Sequential, on an idle stack: POST /v1/allocations -> `active`, and the strict baseline started -> completed,
    interleaved one for one so both see the same machine. Milliseconds."""
    fleet_file = await stack.load_fleet(8)
    tag = "gw" if via_gateway else "direct"
    queues = Queues(control=f"latency-{tag}.control", node_prefix=f"latency-{tag}.node.")
    workers = await run_workers(stack, fleet_file, queues, via_gateway)
    baseline_worker = Worker(
        stack.client, task_queue="latency.baseline", workflows=[BaselineWorkflow], activities=[noop]
    )
    asyncio.create_task(baseline_worker.run())
    samples: dict[str, list[float]] = {"allocation": [], "strict": []}
    async with api_in_process(stack, queues, "latency") as api:
        for n in range(count + 2):  # the first two warm both paths up and are not counted
            started = time.perf_counter()
            response = await api.post("/v1/allocations", json={"gpu_count": 1})
            assert response.status_code == 202, response.text
            allocation_id = response.json()["id"]
            await _row_reads(stack, allocation_id, "active")
            took = 1000 * (time.perf_counter() - started)
            await allocation_client.release(stack.client, allocation_id)
            await _row_reads(stack, allocation_id, "released")

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
    return {name: p50_p99(values) for name, values in samples.items()}


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
    async with embedded_database(home / "pg-durable", durable=True) as database:
        return await _record_round_trips(database.sessions)


async def contention(stack: Stack, requests: int, control_processes: int = 0) -> dict[str, Any]:
    """The burst: `requests` x 2 GPUs at once for 400 GPUs, decided by the control worker in this process or by
    `control_processes` control workers each in its own process."""
    fleet_file = await stack.load_fleet(50)  # 400 GPUs for 2,000 requested
    tag = f"-{control_processes}p" if control_processes else ""
    queues = Queues(control=f"contention{tag}.control", node_prefix=f"contention{tag}.node.")
    workers = await run_workers(stack, fleet_file, queues, control_processes=control_processes)
    LOCK_TIMES.clear()
    meter = CpuMeter(stack)
    cpu_before, started = meter.read(), time.perf_counter()
    ids = await allocate(stack, queues, requests, 2)
    all_started = time.perf_counter() - started
    await settled(stack.sessions, ids, ("active", "failed"))
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
    await release_all(stack, list(holding))
    for w in workers:
        await w.shutdown()
    times = stack.stop_control_hosts() or [lock_times()]
    stack.stop_agents()
    round_trips = await _record_round_trips(stack.sessions)
    held_all = [ms for t in times for ms in t["held"]]
    waited_all = [ms for t in times for ms in t["waited"]]
    held, waited = p50_p99(held_all or [0.0]), p50_p99(waited_all or [0.0])
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
    await run_workers(stack, fleet_file, queues, control_processes=control_processes)
    meter = CpuMeter(stack)
    measured = []
    for _ in range(rounds):
        await stack.report(fleet_file)
        ids: list[str] = []
        measured.append(await _measured(meter, batch, _allocation_batch(stack, queues, batch, ids)))
        await release_all(stack, ids)
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


# The control worker's workflow runner, by `--sandbox`: Berth's, and two it does not use, to measure what the
# sandbox costs (docs/benchmarks.md, "The three levers, each measured alone").
SANDBOXES: dict[str, Callable[[], WorkflowRunner]] = {
    "as-shipped": worker.workflow_runner,
    "passthrough-all": lambda: SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_all_modules()
    ),
    "none": UnsandboxedWorkflowRunner,
}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as home:
        stack = Stack(Path(home))
        stack.workflow_runner = SANDBOXES[args.sandbox]()
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
        "--sandbox",
        choices=tuple(SANDBOXES),
        default="as-shipped",
        help="how the in-process control worker runs workflows: as Berth does (worker.workflow_runner), with every "
        "module passed through the sandbox, or with no sandbox; the other two are measurements only: they lose "
        "the sandbox's determinism check (tests/workflows/test_sandbox.py)",
    )
    parser.add_argument(
        "--agents",
        choices=("gateway", "direct", "both"),
        default="gateway",
        help="how agents reach Temporal in the throughput and latency phases (both: a before/after in one run)",
    )
    asyncio.run(main(parser.parse_args()))
