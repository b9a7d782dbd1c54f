"""Preemption under load: how long from the admission pass's decision to preempt to the preemptor's plan,
against a real Temporal dev server and a real PostgreSQL started by the benchmark, with the same path without
preemption measured in the same run as the baseline.

    python -m bench.preemption [--nodes 16]

    baseline   the fleet (N nodes x 8 GPUs) is filled with 8-GPU allocations of priority 0, N requests of 8 GPUs
               queue behind them, and the holders are released one at a time: release -> the queued request's
               `woken` step (its plan starts), as `bench.queues` measures it
    preempt    the fleet is filled with 8-GPU allocations of a preemptible class whose grace period is 1 ms, and N
               requests of a higher class queue one at a time: each first pass decides a preemption (its victims
               and the node held for it) and tells the victim; the victim's grace period passes and it releases;
               its release's pass wakes the preemptor

Reported, p50 and p99, wall clock on this machine (PostgreSQL, Temporal and this process share its clock):

- decision -> preemptor woken, less the grace period: the pass that nominated (seen in this process: the control
  worker runs here) to the preemptor's `woken` event;
- where it goes: decision -> the victim's `preempt_notice` event (the signal and the victim's workflow task), notice ->
  the victim's claims released (the grace period, then destroy_vm on the host and release_claims), release -> woken
  (the pass in release_claims and the wake signal);
- the baseline's release -> woken, and a release's own teardown (the update asked -> its claims released), for
  comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text

from activities.control import admission
from bench.fleets import BERTH, bench_fleet
from bench.polling import settled
from bench.rows import step_times
from bench.stack import Request, Stack, release, run_workers, start
from bench.stats import print_figures
from contracts.task_queues import Queues
from workflows.allocation.messages import QueueWait

GRACE_S = 0.001


def fleet_yaml(nodes: int) -> str:
    """The bench fleet with a preemptible class whose grace period is 1 ms and a class above it, a tenant each."""
    classes = [
        {
            "apiVersion": BERTH,
            "kind": "PriorityClass",
            "metadata": {"name": "spot"},
            "spec": {"value": 0, "preemptible": True, "gracePeriod": "1ms"},
        },
        {"apiVersion": BERTH, "kind": "PriorityClass", "metadata": {"name": "urgent"}, "spec": {"value": 100}},
    ]
    return bench_fleet(nodes, tenants={"spot": {}, "urgent": {}}, extra=classes, prefix="p-")


class Decisions:
    """When each nomination was decided: the admission pass is wrapped in this process (the control worker's)."""

    def __init__(self) -> None:
        self.at: dict[str, tuple[float, tuple[str, ...]]] = {}  # preemptor -> (decided, victims)

    def install(self) -> None:
        decide = admission.admission_pass

        def seen(*args: Any, **kwargs: Any) -> Any:
            result = decide(*args, **kwargs)
            now = time.time()
            for verdict in result.verdicts:
                if verdict.preempt_reasons and verdict.nomination is not None:
                    self.at.setdefault(verdict.allocation_id, (now, verdict.nomination.victims))
            return result

        admission.admission_pass = seen  # type: ignore[assignment]


async def _freed(stack: Stack, ids: list[str]) -> dict[str, float]:
    async with stack.sessions() as session:
        rows = await session.execute(
            text(
                "SELECT allocation_id, max(released_at) FROM allocation_resource_claims "
                "WHERE allocation_id = ANY(:ids) GROUP BY 1"
            ),
            {"ids": ids},
        )
        return {a: at.timestamp() for a, at in rows if at is not None}


async def run(stack: Stack, nodes: int, decisions: Decisions) -> dict[str, list[float]]:
    path = await stack.load_fleet(nodes, fleet_yaml(nodes))
    queues = Queues(control="preempt.control", node_prefix="preempt.node.")
    await run_workers(stack, path, queues)
    wait = QueueWait(timeout_seconds=3600, priority=100, priority_class="urgent")

    # Baseline: holders of priority 0 (not preemptible), requests queued behind them, holders released one by one.
    holders = [Request(f"hold-{uuid.uuid4().hex[:8]}", "spot", 8) for _ in range(nodes)]
    await asyncio.gather(*(start(stack, queues, h) for h in holders))
    await _until(stack, [h.allocation_id for h in holders], ("active",), "baseline fill")
    waiting = [Request(f"wait-{uuid.uuid4().hex[:8]}", "urgent", 8) for _ in range(nodes)]
    for request in waiting:
        await start(stack, queues, request, QueueWait(timeout_seconds=3600))
    await _until(stack, [r.allocation_id for r in waiting], ("queued",), "baseline queue")
    asked: dict[str, float] = {}
    for holder in holders:
        asked[holder.allocation_id] = time.time()
        await release(stack, holder.allocation_id)
        await asyncio.sleep(0.3)
    await _until(stack, [r.allocation_id for r in waiting], ("active",), "baseline placed")
    freed = await _freed(stack, [h.allocation_id for h in holders])
    woken = await step_times(stack.sessions, steps=["woken"])
    woke = sorted(steps["woken"] for a, steps in woken.items() if a in {r.allocation_id for r in waiting})
    baseline = [w - f for f, w in zip(sorted(freed.values()), woke, strict=False)]
    teardown = [freed[a] - at for a, at in asked.items() if a in freed]
    for request in waiting:
        await release(stack, request.allocation_id)
    await _until(stack, [r.allocation_id for r in waiting], ("released",), "baseline released")

    # Preemption: spot holders, then urgent requests queued one at a time, each preempting one node's holder.
    spots = [f"spot-{uuid.uuid4().hex[:8]}" for _ in range(nodes)]
    await asyncio.gather(*(start(stack, queues, Request(a, "spot", 8), priority_class="spot") for a in spots))
    await _until(stack, spots, ("active",), "spot fill")
    urgent = [f"urgent-{uuid.uuid4().hex[:8]}" for _ in range(nodes)]
    for allocation_id in urgent:
        await start(stack, queues, Request(allocation_id, "urgent", 8), wait, priority_class="urgent")
        await asyncio.sleep(0.3)
    await _until(stack, urgent, ("active",), "preemptors placed")
    await _until(stack, spots, ("preempted",), "victims preempted")
    events = await step_times(stack.sessions, steps=["woken", "preempt_notice", "preempt"])
    victims_freed = await _freed(stack, spots)
    total, notice, leave, grace, wake = [], [], [], [], []
    for preemptor in urgent:
        decided, victims = decisions.at[preemptor]
        told = max(events[v]["preempt_notice"] for v in victims)
        gone = max(victims_freed[v] for v in victims)
        up = events[preemptor]["woken"]
        total.append(up - decided - GRACE_S)
        notice.append(told - decided)
        leave.append(gone - told - GRACE_S)
        grace.append(max(events[v]["preempt"] for v in victims) - told - GRACE_S)
        wake.append(up - gone)
    for allocation_id in urgent:
        await release(stack, allocation_id)
    return {
        "baseline": baseline,
        "teardown": teardown,
        "total": total,
        "notice": notice,
        "leave": leave,
        "grace": grace,
        "wake": wake,
    }


async def _until(stack: Stack, ids: list[str], states: tuple[str, ...], what: str) -> None:
    """Every phase waits for its allocations' rows alike: read every 0.2 s, for at most 5 minutes."""
    await settled(stack.sessions, ids, states, every=0.2, timeout=300, what=what)


def report(figures: dict[str, list[float]], nodes: int) -> None:
    print(f"preemption, {nodes} nodes x 8 GPUs, {nodes} preemptions (ms, p50 / p99):")
    names = {
        "baseline": "baseline: release -> queued request woken (no preemption)",
        "teardown": "baseline: release asked -> its claims released",
        "total": "decision -> preemptor woken, grace period excluded",
        "notice": "  decision -> victim's preempt_notice",
        "leave": "  notice -> victim's claims released (less the grace period)",
        "grace": "    of which notice -> its teardown starts (the grace timer)",
        "wake": "  release -> preemptor woken",
    }
    print_figures(figures, names, 60)


async def main(args: argparse.Namespace) -> None:
    decisions = Decisions()
    decisions.install()
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as home:
        stack = Stack(Path(home))
        try:
            await stack.connect()
            report(await run(stack, args.nodes, decisions), args.nodes)
        finally:
            await stack.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16, help="8-GPU nodes, and preemptions")
    asyncio.run(main(parser.parse_args()))
