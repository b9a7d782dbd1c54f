"""Queues under load: a full fleet, many queued requests of mixed sizes from four weighted tenants,
capacity freed in waves, against a real Temporal dev server and a real PostgreSQL started by the benchmark.

    python -m bench.queues [--requests 200] [--nodes 16] [--hold 8] [--wave 4] [--wave-pause 2] [--seed 1]
    python -m bench.queues --requests 1000                   # the size docs/benchmarks.md quotes its targets at

    fill       the fleet (N nodes x 8 GPUs) is filled by `fill`'s 4-GPU holders, two per node, placed as today
    queue      `--requests` allocation workflows that may wait (`AllocationInput.queue`), sizes 1, 2, 4 and 8 GPUs
               in equal numbers, from four tenants with weights 1:1:2:4 (an equal number each, so fair share and
               arrival order would give visibly different splits), started in a shuffled order; all are `queued`
    waves      the holders are released `--wave` at a time every `--wave-pause` seconds
    turnover   each queued request placed holds for `--hold` seconds from `active`, then the benchmark releases it,
               until every queued request has run

Reported (wall clock on this machine; the clocks of PostgreSQL, Temporal and this process are the same host's):

1. Release -> plan: for each `release_claims` whose admission pass woke a queued request, from the claims' release
   (`allocation_resource_claims.released_at`, the release's transaction) to the first woken request's `woken`
   step (`allocation_events.at`: the workflow task that took the wake and starts its plan). Which pass woke whom is
   recorded in this process (the control worker runs here): `AdmissionActivities.walk` is wrapped. Then where the
   time went: release -> pass start, region lock wait, the pass, signals sent before it, the signal's RPC, and
   signal -> the woken workflow task. p50 and p99.
2. Fair share: each tenant's GPU-seconds (`ready` -> `released` events, times its GPUs) over the window in which all
   four tenants had requests waiting (from the first holder's release to the moment the first tenant's last request
   was woken), against its weight's share.
3. The 8-GPU requests' waits against their earliest possible start (see `_largest`).
4. The admission passes: how many ran, and their time (`activities.control.admission.PASS_TIMES`, the work under the
   region lock).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import dataclasses
import json
import logging
import random
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text
from temporalio import activity

from activities.control import admission
from activities.control.admission import PASS_TIMES, AdmissionActivities
from activities.control.placement import LOCK_TIMES
from bench.fleets import bench_fleet
from bench.polling import settled
from bench.rows import step_times
from bench.stack import CpuMeter, Request, Stack, release, run_workers, start
from bench.stats import percentile
from contracts.allocation import FINAL_STATES
from contracts.task_queues import Queues
from workflows.allocation.messages import QueueWait

TENANTS = {"alpha": 1, "bravo": 1, "charlie": 2, "delta": 4}  # name -> fair-share weight
SIZES = (1, 2, 4, 8)
FILL = "fill"


def fleet_yaml(nodes: int) -> str:
    """The bench fleet in a region that queues, with the holders' tenant and the four weighted tenants."""
    tenants = {FILL: {}, **{name: {"weight": weight} for name, weight in TENANTS.items()}}
    return bench_fleet(nodes, tenants=tenants, region={"queueingStrategy": "BestEffortFIFO"}, prefix="q-")


# -- what the control worker did, recorded in this process --------------------------------------------------------


@dataclass
class Walk:
    """One `AdmissionActivities.walk`: who ran it (the activity and its allocation), its passes, whom it woke."""

    caller: str
    allocation: str | None
    started: float  # time.time()
    ended: float = 0.0
    lock_wait: float = 0.0  # seconds, all its passes
    pass_started: float = 0.0  # the (last) pass: under the lock, time.time()
    pass_ended: float = 0.0
    woken: list[str] = field(default_factory=list)
    signals: dict[str, tuple[float, float]] = field(default_factory=dict)  # allocation -> (sent, answered)


@dataclass
class PassSeen:
    at: float
    reserved: dict[str, str]  # allocation -> node reserved for it
    admitted: dict[str, str]  # allocation -> node set aside for it


class Failures(logging.Handler):
    """Counts the passes that failed (logged by the step that ran them), by the error's first line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.seen[str(record.exc_info[1]).splitlines()[0][:120]] += 1


class Probe:
    """Wraps the admission activities' walk, lock, pass and wake to see which pass woke whom, and when."""

    def __init__(self) -> None:
        self.walks: list[Walk] = []
        self.passes: list[PassSeen] = []
        self.current: contextvars.ContextVar[Walk | None] = contextvars.ContextVar("walk", default=None)
        self.failures = Failures()

    def install(self) -> None:
        probe = self
        logging.getLogger("temporalio").addHandler(self.failures)
        walk, signal, lock, decide = (
            AdmissionActivities.walk,
            AdmissionActivities._signal,
            admission.lock_region,
            admission.admission_pass,
        )

        async def timed_walk(self: AdmissionActivities, regions: list[str] | None) -> Any:
            caller, allocation = "direct", None
            with contextlib.suppress(RuntimeError):
                info = activity.info()
                caller, allocation = info.activity_type, info.workflow_id.partition("/")[2] or None
            record = Walk(caller, allocation, time.time())
            token = probe.current.set(record)
            try:
                result = await walk(self, regions)
                record.woken = list(result.woken)
                return result
            finally:
                record.ended = time.time()
                probe.walks.append(record)
                probe.current.reset(token)

        async def timed_signal(self: AdmissionActivities, allocation_id: str, name: str, argument: Any = None) -> None:
            sent = time.time()
            await signal(self, allocation_id, name, argument)
            record = probe.current.get()
            if record is not None and name == admission.WAKE_SIGNAL:
                record.signals[allocation_id] = (sent, time.time())

        async def timed_lock(session: Any, region: str) -> None:
            started = time.perf_counter()
            await lock(session, region)
            record = probe.current.get()
            if record is not None:
                record.lock_wait += time.perf_counter() - started
                record.pass_started = time.time()

        def seen_pass(*args: Any, **kwargs: Any) -> Any:
            result = decide(*args, **kwargs)
            admitted = {v.allocation_id: v.node for v in result.admitted if v.node is not None}
            probe.passes.append(PassSeen(time.time(), result.reservations, admitted))
            record = probe.current.get()
            if record is not None:
                record.pass_ended = time.time()
            return result

        AdmissionActivities.walk = timed_walk  # type: ignore[method-assign]
        AdmissionActivities._signal = timed_signal  # type: ignore[method-assign]
        admission.lock_region = timed_lock  # type: ignore[assignment]
        admission.admission_pass = seen_pass  # type: ignore[assignment]


# -- the run --------------------------------------------------------------------------------------------------------


def mixed_requests(count: int, seed: int) -> list[Request]:
    """`count` requests (rounded down to a multiple of 16): each tenant an equal number, each size equally often
    within each tenant, in a shuffled arrival order."""
    per = max(1, count // (len(TENANTS) * len(SIZES)))
    requests = [
        Request(f"q-{tenant}-{gpus}-{i}", tenant, gpus) for tenant in TENANTS for gpus in SIZES for i in range(per)
    ]
    random.Random(seed).shuffle(requests)
    return requests


async def _report_agents(stack: Stack, fleet_file: Path) -> None:
    """The hosts' reports, as their agents would send them (the bench's agents do not report)."""
    while True:
        await asyncio.sleep(15)
        await stack.report(fleet_file)


async def run(stack: Stack, args: argparse.Namespace, probe: Probe) -> dict[str, Any]:
    path = await stack.load_fleet(args.nodes, fleet_yaml(args.nodes))
    queues = Queues(control="queues.control", node_prefix="queues.node.")
    await run_workers(stack, path, queues)
    reporter = asyncio.create_task(_report_agents(stack, path))
    meter = CpuMeter(stack)
    tasks: set[asyncio.Task[None]] = set()
    try:
        # Fill: two 4-GPU holders per node, placed as today (no queue).
        holders = [Request(f"fill-{i}", FILL, 4) for i in range(2 * args.nodes)]
        started = time.perf_counter()
        await asyncio.gather(*(start(stack, queues, h) for h in holders))
        await settled(
            stack.sessions, [h.allocation_id for h in holders], ("active",), every=0.2, timeout=300, what="fill"
        )
        fill_s = time.perf_counter() - started

        # Queue: every request may wait; all of them find the fleet full.
        requests = mixed_requests(args.requests, args.seed)
        ids = [r.allocation_id for r in requests]
        wait = QueueWait(timeout_seconds=3600)
        PASS_TIMES.held.clear()
        limit = asyncio.Semaphore(16)

        async def queued(request: Request) -> None:
            async with limit:
                await start(stack, queues, request, wait)

        started = time.perf_counter()
        await asyncio.gather(*(queued(r) for r in requests))
        await settled(stack.sessions, ids, ("queued",), every=0.2, timeout=600, what="queue")
        queue_s = time.perf_counter() - started
        queue_passes = list(PASS_TIMES.held)

        # Waves and turnover, until every queued request has run.
        PASS_TIMES.held.clear()
        LOCK_TIMES.clear()
        walks_before = len(probe.walks)
        cpu_before, started = meter.read(), time.perf_counter()
        order = list(holders)
        random.Random(args.seed + 1).shuffle(order)

        async def waves() -> None:
            for i in range(0, len(order), args.wave):
                for holder in order[i : i + args.wave]:
                    _spawn(tasks, release(stack, holder.allocation_id))
                await asyncio.sleep(args.wave_pause)

        _spawn(tasks, waves())
        scheduled: set[str] = set()
        deadline = time.monotonic() + args.limit
        while True:
            async with stack.sessions() as session:
                rows = await session.execute(
                    text("SELECT id, state FROM allocations WHERE id = ANY(:ids) AND state <> 'queued'"), {"ids": ids}
                )
                states = dict(rows.all())
            for allocation_id, state in states.items():
                if state == "active" and allocation_id not in scheduled:
                    scheduled.add(allocation_id)
                    _spawn(tasks, release(stack, allocation_id, after=args.hold))
            if sum(1 for s in states.values() if s in FINAL_STATES) == len(ids):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all requests ran within {args.limit} s: {Counter(states.values())}")
            await asyncio.sleep(0.1)
        run_s, cpu_after = time.perf_counter() - started, meter.read()
        await settled(
            stack.sessions, [h.allocation_id for h in holders], ("released",), every=0.2, timeout=120, what="holders"
        )
        return {
            "requests": requests,
            "holders": holders,
            "fill_s": fill_s,
            "queue_s": queue_s,
            "queue_passes": queue_passes,
            "run_s": run_s,
            "run_passes": list(PASS_TIMES.held),
            "walks": probe.walks[walks_before:],
            "cpu": {group: cpu_after[group] - cpu_before.get(group, 0.0) for group in cpu_after},
            "decision_lock": (list(LOCK_TIMES.held), list(LOCK_TIMES.waited)),
        }
    finally:
        reporter.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(reporter, *tasks, return_exceptions=True)


def _spawn(tasks: set[asyncio.Task[None]], work: Any) -> None:
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


# -- what it shows --------------------------------------------------------------------------------------------------


@dataclass
class Story:
    """One allocation's times, from its events and claims (epoch seconds)."""

    queued: float | None = None
    woken: float | None = None
    ready: float | None = None
    released: float | None = None
    node: str | None = None
    claimed: float | None = None
    freed: float | None = None  # its claims' release


async def stories(stack: Stack) -> tuple[dict[str, Story], list[tuple[str, str, float, float]]]:
    """Every allocation's story, and every claim as (allocation, node, claimed, released)."""
    steps = {"enter_queue": "queued", "woken": "woken", "ready": "ready", "released": "released"}
    by_id: dict[str, Story] = defaultdict(Story)
    for allocation_id, times in (await step_times(stack.sessions, steps=list(steps))).items():
        for step, at in times.items():
            setattr(by_id[allocation_id], steps[step], at)
    async with stack.sessions() as session:
        claims = (
            await session.execute(
                text(
                    "SELECT allocation_id, node_id, claimed_at, coalesce(released_at, now()) "
                    "FROM allocation_resource_claims"
                )
            )
        ).all()
    spans = [(a, node, claimed.timestamp(), released.timestamp()) for a, node, claimed, released in claims]
    for allocation_id, node, claimed, released in spans:
        story = by_id[allocation_id]
        story.node, story.claimed = node, claimed
        story.freed = max(story.freed or 0.0, released)
    return dict(by_id), spans


def release_to_plan(walks: list[Walk], by_id: dict[str, Story]) -> dict[str, Any]:
    """Per release whose pass woke someone: release -> the first woken request's `woken` step, and its parts."""
    totals: list[float] = []
    parts: dict[str, list[float]] = defaultdict(list)
    skipped = 0
    for walk in walks:
        if walk.caller != "release_claims" or not walk.woken or walk.allocation not in by_id:
            continue
        released = by_id[walk.allocation].freed
        woken = [(by_id[w].woken, w) for w in walk.woken if w in by_id and by_id[w].woken is not None]
        woken = [(at, w) for at, w in woken if released is not None and at >= walk.started - 0.001]
        if released is None or not woken:
            skipped += 1  # a request woken again (its trail keeps the first `woken` only)
            continue
        at, first = min(woken)
        totals.append(at - released)
        sent, answered = walk.signals.get(first, (walk.ended, walk.ended))
        parts["release -> pass start"].append(walk.started - released)
        parts["region lock wait"].append(walk.lock_wait)
        parts["pass (under the lock)"].append(max(walk.pass_ended - walk.pass_started, 0.0))
        parts["commit, signals sent before it"].append(max(sent - walk.pass_ended, 0.0))
        parts["its signal sent -> its workflow task"].append(at - sent)
        parts["(of which the signal RPC)"].append(answered - sent)
    return {"totals": totals, "parts": parts, "skipped": skipped}


def fair_share(
    requests: list[Request], by_id: dict[str, Story], start: float, saturated: int | None = None
) -> dict[str, Any]:
    """GPU-seconds per tenant over [start, the moment the first tenant had nothing left waiting]; with `saturated`
    (the fleet's GPUs), until the first moment a tenant's waiting GPUs fell below its weighted share of the fleet
    (past it, that tenant cannot use its share however the queue is ordered)."""
    last_woken: dict[str, float] = {}
    for r in requests:
        woken = by_id[r.allocation_id].woken or 0.0
        last_woken[r.tenant] = max(last_woken.get(r.tenant, 0.0), woken)
    end = min(last_woken.values())
    first_done = min(last_woken, key=lambda t: last_woken[t])
    if saturated is not None:
        for tenant, weight in TENANTS.items():
            mine = sorted(((by_id[r.allocation_id].woken or 0.0), r.gpus) for r in requests if r.tenant == tenant)
            waiting = sum(g for _w, g in mine)
            for woken, gpus in mine:
                waiting -= gpus
                if waiting < saturated * weight / sum(TENANTS.values()):
                    if woken < end:
                        end, first_done = woken, tenant
                    break
    seconds: dict[str, float] = defaultdict(float)
    for r in requests:
        story = by_id[r.allocation_id]
        if story.ready is None or story.released is None:
            continue
        overlap = min(story.released, end) - max(story.ready, start)
        seconds[r.tenant] += r.gpus * max(overlap, 0.0)
    total = sum(seconds.values()) or 1.0
    weights = sum(TENANTS.values())
    return {
        "window": end - start,
        "first_done": first_done,
        "tenants": {t: (seconds[t], seconds[t] / total, w / weights) for t, w in TENANTS.items()},
    }


def _first_empty(spans: list[tuple[float, float]], after: float, before: float) -> float | None:
    """The first moment in [after, before) at which none of these claim spans is active."""
    t = after
    for claimed, released in sorted(spans):
        if claimed > t:
            break
        t = max(t, released)
    return t if t < before else None


def _largest(
    requests: list[Request], by_id: dict[str, Story], spans: list[tuple[str, str, float, float]], passes: list[PassSeen]
) -> dict[str, Any]:
    """The 8-GPU requests' waits (queued -> woken) against two earliest starts.

    `its turn`: the first pass that gave it a reservation (every request ahead of it in the pass's order placed or
    passed over; or the pass that set a node aside for it, if it never needed a reservation), or the moment the node
    it was placed on had emptied of the claims made before its own, whichever is later. Past that, nothing but the
    release -> plan path stands between it and its start: `woken - its turn` is its excess wait (target: 0).
    `any empty node`: the first moment after it was queued when some node had no claim at all (what the brief calls
    the earliest possible start ignoring order: other requests ahead of it in fair-share order may take that node
    first, legitimately)."""
    by_node: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _a, node, claimed, released in spans:
        by_node[node].append((claimed, released))
    first_turn: dict[str, float] = {}
    for seen in passes:
        for allocation_id in [*seen.reserved, *seen.admitted]:
            first_turn.setdefault(allocation_id, seen.at)
    rows = []
    for r in requests:
        story = by_id[r.allocation_id]
        if r.gpus != 8 or story.queued is None or story.woken is None or story.claimed is None:
            continue
        own = [(c, f) for a, node, c, f in spans if node == story.node and a != r.allocation_id and c < story.claimed]
        emptied = max((f for _c, f in own), default=story.queued)
        turn = max(first_turn.get(r.allocation_id, story.woken), emptied)
        empties = [_first_empty(s, story.queued, story.woken + 1e9) for s in by_node.values()]
        any_empty = min((e for e in empties if e is not None), default=story.queued)
        rows.append(
            {
                "id": r.allocation_id,
                "tenant": r.tenant,
                "wait": story.woken - story.queued,
                "turn_after": turn - story.queued,
                "excess": story.woken - turn,
                "reserved_wait": story.woken - first_turn.get(r.allocation_id, story.woken),
                "any_empty_after": any_empty - story.queued,
            }
        )
    return {"rows": rows}


def report(result: dict[str, Any], by_id: dict[str, Story], spans: list, args: argparse.Namespace) -> None:
    requests: list[Request] = result["requests"]
    holders: list[Request] = result["holders"]
    states = Counter("released" if by_id[r.allocation_id].released else "not released" for r in [*requests, *holders])
    print(
        f"\nfleet: {args.nodes} nodes x 8 GPUs; {len(holders)} 4-GPU holders; {len(requests)} queued requests "
        f"(sizes {'/'.join(map(str, SIZES))}, tenants {', '.join(f'{t} w{w}' for t, w in TENANTS.items())}); "
        f"hold {args.hold:g} s; waves of {args.wave} holders every {args.wave_pause:g} s"
    )
    print(
        f"fill {result['fill_s']:.1f} s; queueing all {len(requests)} {result['queue_s']:.1f} s; "
        f"waves + turnover {result['run_s']:.1f} s; final states {dict(states)}"
    )

    latency = release_to_plan(result["walks"], by_id)
    totals = [1000 * t for t in latency["totals"]]
    print(
        f"\n1. release -> next queued request's `woken` step, {len(totals)} releases that woke someone "
        f"({latency['skipped']} left out: only re-wakes):"
    )
    print("\n| part | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|")
    for name, values in latency["parts"].items():
        ms = [1000 * v for v in values]
        print(f"| {name} | {statistics.median(ms):.0f} | {percentile(ms, 0.99):.0f} | {max(ms):.0f} |")
    print(
        f"| **release -> woken** | **{statistics.median(totals):.0f}** | **{percentile(totals, 0.99):.0f}** "
        f"| {max(totals):.0f} |"
    )

    released = [by_id[h.allocation_id].freed for h in holders if by_id[h.allocation_id].freed]
    print("\n2. fair share: each tenant's GPU-seconds (`ready` -> `released`) from the first holder's release")
    for saturated in (None, 8 * args.nodes):
        share = fair_share(requests, by_id, min(released), saturated)
        until = "had GPUs waiting at least its weighted share of the fleet" if saturated else "had requests waiting"
        print(f"\nover the {share['window']:.1f} s in which every tenant {until} (until {share['first_done']}):")
        print("\n| tenant | weight | GPU-seconds | share of the four | weighted share | off by |")
        print("|---|---:|---:|---:|---:|---:|")
        for tenant, (seconds, got, due) in share["tenants"].items():
            print(
                f"| {tenant} | {TENANTS[tenant]} | {seconds:.0f} | {100 * got:.1f}% | {100 * due:.1f}% "
                f"| {100 * (got / due - 1):+.1f}% |"
            )

    largest = _largest(requests, by_id, spans, result["passes"])["rows"]
    if largest:
        longest = max(largest, key=lambda row: row["wait"])
        excess = [1000 * row["excess"] for row in largest]
        print(
            f"\n3. 8-GPU requests ({len(largest)}): longest wait {longest['wait']:.1f} s ({longest['id']}); its turn "
            f"came {longest['turn_after']:.1f} s after it queued, it was woken {1000 * longest['excess']:.0f} ms "
            f"after its turn (reserved {longest['reserved_wait']:.1f} s); some node was first empty "
            f"{longest['any_empty_after']:.1f} s after it queued"
        )
        print(
            f"   woken after its turn, all 8-GPU requests: p50 {statistics.median(excess):.0f} ms, "
            f"p99 {percentile(excess, 0.99):.0f} ms, max {max(excess):.0f} ms; waits p50 "
            f"{statistics.median(row['wait'] for row in largest):.1f} s"
        )

    for phase in ("queue_passes", "run_passes"):
        passes = result[phase]
        name = "while queueing" if phase == "queue_passes" else "during waves and turnover"
        if passes:
            print(
                f"\n4. admission passes {name}: {len(passes)}, under the lock p50 {statistics.median(passes):.1f} "
                f"ms, p99 {percentile(passes, 0.99):.1f} ms, max {max(passes):.1f} ms"
            )
    walks = Counter(w.caller for w in result["walks"])
    print(
        f"   walks by step: {dict(walks)}; wakes sent: {sum(len(w.signals) for w in result['walks'])}; "
        f"requests woken more than once: {_rewoken(result['walks'])}"
    )
    back, revoked = fruitless(result["walks"], result["passes"])
    print(
        f"   woken requests that found no room and went back to the queue: {back}; of them, {revoked} had their "
        "node taken back by a later pass (set-asides are forgotten and judged again) before they placed themselves"
    )
    held, waited = result["decision_lock"]
    if held:
        print(
            f"   placement decisions (choose_placement, ...) under the region lock: {len(held)}, held p50 "
            f"{statistics.median(held):.1f} ms, p99 {percentile(held, 0.99):.1f} ms; waited p50 "
            f"{statistics.median(waited):.0f} ms, p99 {percentile(waited, 0.99):.0f} ms"
        )
    print(
        f"   errors logged by the steps (passes that failed and were retried or left to a later pass): "
        f"{dict(result['failures']) or 'none'}"
    )
    cpu = result["cpu"]
    print("   CPU seconds during waves and turnover: " + ", ".join(f"{g} {s:.1f}" for g, s in cpu.items()))


def _rewoken(walks: list[Walk]) -> int:
    counts = Counter(a for w in walks for a in w.signals)
    return sum(1 for n in counts.values() if n > 1)


def fruitless(walks: list[Walk], passes: list[PassSeen]) -> tuple[int, int]:
    """(woken requests that went back to the queue, those of them whose node a later pass took away before they
    placed themselves): each re-entry is an `enter_queue` walk during the turnover."""
    wakes: dict[str, list[float]] = defaultdict(list)
    for walk in walks:
        for allocation_id, (sent, _answered) in walk.signals.items():
            wakes[allocation_id].append(sent)
    back = revoked = 0
    for walk in walks:
        if walk.caller != "enter_queue" or walk.allocation is None:
            continue
        woken = [t for t in wakes.get(walk.allocation, []) if t < walk.started]
        if not woken:
            continue
        back += 1
        between = [p for p in passes if max(woken) < p.at < walk.started]
        revoked += any(walk.allocation not in p.admitted for p in between)
    return back, revoked


def _dump(path: Path, result: dict[str, Any], by_id: dict[str, Story], spans: list[Any]) -> None:
    """The run's raw figures as JSON, for a closer look."""
    data = {
        "requests": [dataclasses.asdict(r) for r in result["requests"]],
        "holders": [dataclasses.asdict(r) for r in result["holders"]],
        "stories": {a: dataclasses.asdict(s) for a, s in by_id.items()},
        "claims": spans,
        "walks": [dataclasses.asdict(w) for w in result["walks"]],
        "passes": [dataclasses.asdict(p) for p in result["passes"]],
    }
    path.write_text(json.dumps(data))


async def main(args: argparse.Namespace) -> None:
    probe = Probe()
    probe.install()
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as home:
        stack = Stack(Path(home))
        try:
            await stack.connect()
            result = await run(stack, args, probe)
            result["passes"] = probe.passes
            result["failures"] = probe.failures.seen
            by_id, spans = await stories(stack)
            if args.dump:
                _dump(Path(args.dump), result, by_id, spans)
            report(result, by_id, spans, args)
        finally:
            await stack.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="queued requests (a multiple of 16)")
    parser.add_argument("--nodes", type=int, default=16, help="8-GPU nodes")
    parser.add_argument("--hold", type=float, default=8.0, help="seconds each placed request holds before release")
    parser.add_argument("--wave", type=int, default=4, help="holders released at a time")
    parser.add_argument("--wave-pause", type=float, default=2.0, help="seconds between waves")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dump", help="write the run's raw figures to this JSON file")
    parser.add_argument("--limit", type=float, default=1800, help="seconds the turnover may take in all")
    asyncio.run(main(parser.parse_args()))
