"""Chaos: kill -9 each part of a running stack while allocations are in flight, then check what a skeptical SRE would.

    python -m bench.chaos [--rounds 3] [--clients 8] [--dwell 8] [--json FILE]

The stack is `berth up`'s own supervised stack (devstack/), in a temporary state directory, on loopback, with the
fleet `bench/chaos_fleet.yaml` (four simulated 8-GPU hosts). Clients create allocations through the HTTP API as a
careful client would: every create carries a fresh Idempotency-Key and is retried, with the same key, on a 503 or a
connection error until it gets an answer; each client keeps up to `--in-flight` of its allocations being placed
and releases some of what it holds. Meanwhile each part in turn (the
Temporal server, PostgreSQL, the control worker, the API, one node agent process) is killed with SIGKILL, and the
supervisor restarts it. Afterwards:

- no allocation lost (every id a client was given has its row) or duplicated (no row nobody was given);
- no double claim in SQL (two active claims on one slot);
- active allocations = allocations with active claims = VMs on the hosts;
- no allocation stuck in a non-final state, no live lease on a host without an allocation in flight;
- the API answered only 200, 202, 4xx or 503 throughout (connection errors while the API was down are counted
  apart: no answer is not a wrong answer);
- the reconciler (`POST /v1/audit`, what `berth audit` shows) finds no drift either;
- bounded recovery: every allocation in flight when a part was killed is active or final within 30 s of the part's
  return (each fault's settle times, p50/p99/max, are in the report; the next kill waits for them);
- after everything is released: every slot available, and no VM, active claim or live lease left;
- the usage ledger agrees with the claims to the second, every attempt of every allocation (no interval lost,
  doubled, cut short or left open: store/usage.py's `drift` over the whole history).

`tests/chaos/` runs a short form of this in CI; the long form's figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from agent.leases import LeaseStore
from agent.simulated import SimulatedVmDriver
from bench.polling import until
from bench.stats import percentile
from config.context import StackContext
from config.settings import Settings
from contracts.allocation import FINAL_STATES, PLACING_STATES
from devstack.stack import DevStack
from fleet.node import Simulation
from store import usage
from store.db import create_engine
from store.outage import is_database_outage

FLEET = Path(__file__).with_name("chaos_fleet.yaml")
TENANT = "chaos"
KILLABLE = ("temporal", "postgres", "control-worker", "api", "gateway", "agents-0")
IN_FLIGHT = (*PLACING_STATES, "releasing")


SETTLE_BOUND_SECONDS = 30.0  # recovery is bounded: every allocation in flight settles within this of the part's return


class Fault(BaseModel):
    part: str
    in_flight: int = Field(description="Allocations being placed or released when the part was killed.")
    back_after_seconds: float
    settle_seconds: list[float] = Field(
        default_factory=list,
        description="Per allocation in flight at the kill: seconds from the part's return until it was active or "
        "final (0 for one that settled while the part was down).",
    )
    unsettled: list[str] = Field(default_factory=list, description="Still in flight when the wait gave up.")

    def settle_summary(self) -> dict[str, float]:
        """The settle times' p50, p99 and max; 0 each with none in flight."""
        return {
            "p50": percentile(self.settle_seconds, 0.5, empty=0.0),
            "p99": percentile(self.settle_seconds, 0.99, empty=0.0),
            "max": max(self.settle_seconds, default=0.0),
        }

    @property
    def bounded(self) -> bool:
        return not self.unsettled and max(self.settle_seconds, default=0.0) <= SETTLE_BOUND_SECONDS


class Check(BaseModel):
    name: str
    ok: bool
    detail: str = ""


class ChaosReport(BaseModel):
    faults: list[Fault] = Field(default_factory=list)
    created: int = 0  # allocations the clients were given an id for
    answers: dict[str, int] = Field(default_factory=dict)  # HTTP status -> count, every answer the API gave
    connection_errors: int = 0
    settled: list[Check] = Field(default_factory=list)
    released: list[Check] = Field(default_factory=list)
    states: dict[str, int] = Field(default_factory=dict)  # the allocations' states once settled
    failure_reasons: dict[str, int] = Field(default_factory=dict)  # failed allocations by reason code

    @property
    def ok(self) -> bool:
        return all(check.ok for check in (*self.settled, *self.released)) and all(f.bounded for f in self.faults)

    def failures(self) -> list[str]:
        checks = [f"{c.name}: {c.detail}" for c in (*self.settled, *self.released) if not c.ok]
        slow = [
            f"after {f.part} came back, not every allocation in flight settled within {SETTLE_BOUND_SECONDS:g}s: "
            f"{f.settle_summary()}, still in flight {f.unsettled[:5]}"
            for f in self.faults
            if not f.bounded
        ]
        return checks + slow


# -- the clients -------------------------------------------------------------------------------------------------------


def allowed(status: int) -> bool:
    return status in (200, 202, 503) or 400 <= status < 500


class Clients:
    """Careful API clients: a create is retried with its Idempotency-Key until the API gives an answer."""

    def __init__(self, api_url: str, token: str, seed: int = 7) -> None:
        self.http = httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        self.rng = random.Random(seed)
        self.answers: Counter[int] = Counter()
        self.connection_errors = 0
        self.given: dict[str, str] = {}  # allocation id -> the key it was created with
        self.placing: set[str] = set()  # given, and not yet seen active or final

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, path: str, **kwargs: object) -> httpx.Response | None:
        try:
            response = await self.http.request(method, path, **kwargs)  # type: ignore[arg-type]
        except httpx.TransportError:
            self.connection_errors += 1
            return None
        self.answers[response.status_code] += 1
        return response

    async def until_answered(self, method: str, path: str, patience: float = 300, **kwargs: object) -> httpx.Response:
        """Retry on a 503 or no answer at all, as Retry-After asks; anything else is the answer."""

        async def answer() -> httpx.Response | None:
            response = await self.call(method, path, **kwargs)
            return response if response is not None and response.status_code != 503 else None

        return await until(answer, every=0.5, timeout=patience, what=f"{method} {path} answered but with a 503")

    async def create(self) -> None:
        key = f"chaos-{uuid.uuid4().hex}"
        body = {"gpu_count": self.rng.choice((1, 1, 2, 4)), "shape": "gpu_slice"}
        answer = await self.until_answered("POST", "/v1/allocations", json=body, headers={"Idempotency-Key": key})
        if answer.status_code in (200, 202):
            self.given[answer.json()["id"]] = key
            self.placing.add(answer.json()["id"])

    async def release_one(self) -> None:
        if self.given:
            chosen = self.rng.choice(sorted(self.given))
            await self.until_answered("DELETE", f"/v1/allocations/{chosen}")

    async def run(self, stop: asyncio.Event, in_flight: int) -> None:
        """Create, keeping at most `in_flight` of this client's allocations being placed, and release some."""
        while not stop.is_set():
            while len(self.placing) >= in_flight and not stop.is_set():
                await self.forget_settled()
            await self.create()
            if self.rng.random() < 0.4:
                await self.release_one()

    async def forget_settled(self) -> None:
        for allocation_id in sorted(self.placing):
            answer = await self.call("GET", f"/v1/allocations/{allocation_id}")
            if answer is not None and answer.status_code == 200 and answer.json()["state"] not in PLACING_STATES:
                self.placing.discard(allocation_id)
        await asyncio.sleep(0.2)

    async def finish(self, allocation_id: str) -> None:
        """Release an active allocation, cancel one being placed."""
        detail = await self.until_answered("GET", f"/v1/allocations/{allocation_id}")
        state = detail.json().get("state")
        if state == "active":
            await self.until_answered("DELETE", f"/v1/allocations/{allocation_id}")
        elif state in PLACING_STATES:
            await self.until_answered("POST", f"/v1/allocations/{allocation_id}/cancel")


# -- what the hosts and the database say -------------------------------------------------------------------------------


class Hosts:
    """Each simulated host's own account: the VM files its runtime keeps and the lease files its agent writes."""

    def __init__(self, state_dir: Path) -> None:
        self.nodes = sorted((state_dir / "nodes").glob("*")) if (state_dir / "nodes").exists() else []

    def vms(self) -> dict[str, str]:
        return {
            vm.allocation_id: home.name for home in self.nodes for vm in SimulatedVmDriver(home, Simulation()).list()
        }

    def live_leases(self) -> dict[str, str]:
        now = datetime.now(UTC)
        return {
            lease.allocation_id: home.name
            for home in self.nodes
            for lease in LeaseStore(home / "leases").read_all()
            if lease.live(now)
        }


async def _rows(engine: AsyncEngine, statement: str, patience: float = 120.0) -> list[tuple[object, ...]]:
    """Read, waiting out an outage: right after a PostgreSQL kill the pooled connections are dead once."""
    deadline = time.monotonic() + patience
    while True:
        try:
            async with engine.connect() as connection:
                return [tuple(row) for row in (await connection.execute(text(statement))).all()]
        except Exception as error:
            if not is_database_outage(error) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _states(engine: AsyncEngine) -> dict[str, str]:
    return {str(a): str(s) for a, s in await _rows(engine, "SELECT id, state FROM allocations")}


async def settle_times(
    engine: AsyncEngine, allocations: set[str], back_at: float, give_up_after: float, poll: float = 0.25
) -> tuple[list[float], list[str]]:
    """Watch `allocations` (in flight when a part was killed) until each is active or final: the seconds from the
    part's return (`back_at`, monotonic) until each was first seen settled, and those still in flight after
    `give_up_after` seconds. What is seen is the allocation's row, as the API and the clients see it."""
    waiting, took = set(allocations), []
    while waiting:
        now = time.monotonic()
        states = await _states(engine)
        settled = {a for a in waiting if states.get(a) not in IN_FLIGHT}
        took += [round(max(0.0, now - back_at), 2) for _ in settled]
        waiting -= settled
        if waiting and now - back_at > give_up_after:
            break
        await asyncio.sleep(poll)
    return took, sorted(waiting)


async def _scalars(engine: AsyncEngine, statement: str) -> list[object]:
    return [row[0] for row in await _rows(engine, statement)]


def _diff(name: str, left: set[str], right: set[str]) -> str:
    parts = []
    if left - right:
        parts.append(f"only {name.split('=')[0].strip()}: {sorted(left - right)[:5]}")
    if right - left:
        parts.append(f"only {name.split('=')[-1].strip()}: {sorted(right - left)[:5]}")
    return "; ".join(parts)


async def settled_checks(engine: AsyncEngine, hosts: Hosts, given: set[str]) -> list[Check]:
    states = await _states(engine)
    rows = set(states)
    active = {a for a, s in states.items() if s == "active"}
    claimed = {str(a) for a in await _scalars(engine, CLAIMED)}
    vms = set(hosts.vms())
    in_flight = {a for a, s in states.items() if s in IN_FLIGHT}
    stray_leases = {a for a in hosts.live_leases() if a not in in_flight}
    doubles = await _scalars(engine, DOUBLE_CLAIMS)
    return [
        Check(name="no allocation lost", ok=not given - rows, detail=f"{sorted(given - rows)[:5]}"),
        Check(name="no allocation nobody was given", ok=not rows - given, detail=f"{sorted(rows - given)[:5]}"),
        Check(name="no double claim", ok=not doubles, detail=f"slots {doubles[:5]}"),
        Check(name="active = claimed", ok=active == claimed, detail=_diff("active = claimed", active, claimed)),
        Check(name="claimed = VMs on hosts", ok=claimed == vms, detail=_diff("claimed = VMs", claimed, vms)),
        Check(name="none stuck in flight", ok=not in_flight, detail=f"{sorted(in_flight)[:5]}"),
        Check(
            name="no live lease without an allocation in flight",
            ok=not stray_leases,
            detail=f"{sorted(stray_leases)[:5]}",
        ),
    ]


async def released_checks(engine: AsyncEngine, hosts: Hosts) -> list[Check]:
    states = await _states(engine)
    unfinished = {a for a, s in states.items() if s not in FINAL_STATES}
    slots = await _slot_states(engine)
    busy = {state: count for state, count in slots.items() if state != "available"}
    claims = await _scalars(engine, CLAIMED)
    vms, leases = hosts.vms(), hosts.live_leases()
    return [
        Check(name="every allocation final", ok=not unfinished, detail=f"{sorted(unfinished)[:5]}"),
        Check(name="every slot available", ok=not busy, detail=f"{busy}"),
        Check(name="no active claim left", ok=not claims, detail=f"{claims[:5]}"),
        Check(name="no VM left", ok=not vms, detail=f"{sorted(vms.items())[:5]}"),
        Check(name="no live lease left", ok=not leases, detail=f"{sorted(leases.items())[:5]}"),
        await ledger_check(engine),
    ]


async def ledger_check(engine: AsyncEngine) -> Check:
    """Every attempt's billed interval against its claims: the same GPUs, from the same claim to the same release."""
    async with AsyncSession(engine) as session:
        found = await usage.drift(session)
    return Check(name="usage ledger = claims, to the second", ok=not found, detail=f"{[d.message for d in found[:3]]}")


async def _slot_states(engine: AsyncEngine) -> dict[str, int]:
    rows = await _rows(engine, "SELECT state, count(*) FROM node_resource_slots GROUP BY 1")
    return {str(state): int(count) for state, count in rows}  # type: ignore[call-overload]


async def audit_check(client: Clients, context: StackContext) -> Check:
    """The reconciler's own comparison of PostgreSQL, Temporal and the agents' hosts, run now (report only)."""
    answer = await client.until_answered(
        "POST", "/v1/audit", json={"repair": False}, headers={"Authorization": f"Bearer {context.admin_token}"}
    )
    if answer.status_code != 200:
        return Check(name="berth audit finds no drift", ok=False, detail=f"{answer.status_code} {answer.text[:200]}")
    counts = answer.json()["counts"]
    return Check(name="berth audit finds no drift", ok=not counts, detail=f"{counts}")


CLAIMED = "SELECT DISTINCT allocation_id FROM allocation_resource_claims WHERE released_at IS NULL"
DOUBLE_CLAIMS = (
    "SELECT slot_id FROM allocation_resource_claims WHERE released_at IS NULL GROUP BY slot_id HAVING count(*) > 1"
)


# -- the run -----------------------------------------------------------------------------------------------------------


async def run_chaos(
    stack: DevStack,
    context: StackContext,
    *,
    parts: tuple[str, ...] = KILLABLE,
    clients: int = 6,
    in_flight: int = 25,
    dwell: float = 6.0,
    settle_timeout: float = 300.0,
    say: Callable[[str], None] = print,
) -> ChaosReport:
    """Load, kill each of `parts` in turn (waiting for the supervisor to bring it back), settle, check, release
    everything, check again."""
    report = ChaosReport()
    assert context.database_url and context.api_url
    engine = create_engine(context.database_url, pool_size=2)
    hosts = Hosts(stack.settings.state_dir)
    load = [Clients(context.api_url, context.tenant_tokens[TENANT], seed=n) for n in range(clients)]
    stop = asyncio.Event()
    running = [asyncio.create_task(c.run(stop, in_flight)) for c in load]
    try:
        await asyncio.sleep(dwell)
        for part in parts:
            states = await _states(engine)
            caught = {a for a, s in states.items() if s in IN_FLIGHT}
            victim = stack.pid(part)
            assert victim is not None, f"{part} is not running"
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            say(f"killed {part} (pid {victim}) with {len(caught)} allocations in flight")
            await asyncio.to_thread(stack.wait_ready, part, 180.0, replacing=victim)
            back_at = time.monotonic()
            say(f"{part} is back after {back_at - killed_at:.1f}s")
            # Each fault is measured alone: the next kill waits until what this one caught has settled.
            took, unsettled = await settle_times(engine, caught, back_at, give_up_after=settle_timeout)
            fault = Fault(
                part=part,
                in_flight=len(caught),
                back_after_seconds=round(back_at - killed_at, 1),
                settle_seconds=took,
                unsettled=unsettled,
            )
            say(f"{part}: {len(took)} settled after it came back, {fault.settle_summary()} s, {len(unsettled)} not")
            report.faults.append(fault)
            await asyncio.sleep(dwell)
        stop.set()
        await asyncio.gather(*running)

        given = {a for c in load for a in c.given}

        async def quiet() -> bool:
            """Every allocation active or final, counting one whose create was answered while PostgreSQL was down
            and whose row its workflow has not written yet as still in flight."""
            states = await _states(engine)
            return not given - set(states) and not any(s in IN_FLIGHT for s in states.values())

        await until(quiet, every=1.0, timeout=settle_timeout, what="every allocation active or final")
        report.created = len(given)
        report.states = dict(Counter((await _states(engine)).values()))
        reasons = await _scalars(engine, "SELECT failure_reason FROM allocations WHERE state = 'failed'")
        report.failure_reasons = dict(Counter(str(r or "none").split(":")[0] for r in reasons).most_common())
        report.settled = await settled_checks(engine, hosts, given)
        report.settled.append(await audit_check(load[0], context))

        finisher = load[0]
        for allocation_id in sorted(given):
            await finisher.finish(allocation_id)

        async def all_final() -> bool:
            return all(s in FINAL_STATES for s in (await _states(engine)).values())

        await until(all_final, every=1.0, timeout=settle_timeout, what="every allocation released or final")
        report.released = await released_checks(engine, hosts)
    finally:
        stop.set()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        answers: Counter[int] = sum((c.answers for c in load), Counter())
        report.answers = {str(status): count for status, count in sorted(answers.items())}
        report.connection_errors = sum(c.connection_errors for c in load)
        for client in load:
            await client.close()
        await engine.dispose()
    bad = {status: n for status, n in report.answers.items() if not allowed(int(status))}
    report.settled.append(Check(name="only 200/202/4xx/503 answers", ok=not bad, detail=f"{bad}"))
    return report


def chaos_stack(
    state_dir: Path,
    agent_processes: int = 2,
    say: Callable[[str], None] = print,
    *,
    control_workers: int = 1,
    api_processes: int = 1,
) -> DevStack:
    settings = Settings(state_dir=state_dir)
    return DevStack(
        settings,
        FLEET,
        say=say,
        agent_processes=agent_processes,
        control_workers=control_workers,
        api_processes=api_processes,
    )


def main(args: argparse.Namespace) -> int:
    reports: list[ChaosReport] = []
    for round_number in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="berth-chaos-") as home:
            stack = chaos_stack(Path(home) / "state")
            context = stack.start()
            try:
                report = asyncio.run(
                    run_chaos(stack, context, clients=args.clients, in_flight=args.in_flight, dwell=args.dwell)
                )
            finally:
                stack.stop()
        reports.append(report)
        status = "ok" if report.ok else "FAILED: " + "; ".join(report.failures())
        print(f"round {round_number + 1}: {report.created} allocations, {len(report.faults)} faults, {status}")
    summary = {
        "rounds": len(reports),
        "faults": sum(len(r.faults) for r in reports),
        "allocations": sum(r.created for r in reports),
        "in_flight_at_kill_median": sorted(f.in_flight for r in reports for f in r.faults)[
            len([f for r in reports for f in r.faults]) // 2
        ],
        "failed_checks": [f for r in reports for f in r.failures()],
        "answers": dict(sum((Counter(r.answers) for r in reports), Counter())),
        "connection_errors": sum(r.connection_errors for r in reports),
        "failure_reasons": dict(sum((Counter(r.failure_reasons) for r in reports), Counter())),
        "back_after_seconds": {
            part: sorted(f.back_after_seconds for r in reports for f in r.faults if f.part == part) for part in KILLABLE
        },
        "settle_seconds_after_return": {
            part: Fault(
                part=part,
                in_flight=0,
                back_after_seconds=0,
                settle_seconds=[t for r in reports for f in r.faults if f.part == part for t in f.settle_seconds],
            ).settle_summary()
            for part in KILLABLE
        },
        "reports": [r.model_dump() for r in reports],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "reports"}, indent=2))
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=25, help="allocations each client keeps being placed")
    parser.add_argument("--dwell", type=float, default=8.0, help="seconds of load before and after each kill")
    parser.add_argument("--json", help="write every round's report here")
    raise SystemExit(main(parser.parse_args()))
