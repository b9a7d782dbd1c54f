"""The control worker's CPU per allocation, step by step: the local activities of an allocation's happy path run
one after another against a real PostgreSQL, outside Temporal, so each step's cost is its own.

    python -m bench.control_steps [--nodes 50] [--allocations 300] [--held 200] [--queued 0]

Each allocation runs the control steps its workflow runs, with the audit trail each one carries:

    choose_placement   the allocation's row and its first steps, the snapshot read, both scheduler levels, the
                       first choice recorded under the region's lock
    record_claims      the steps since, the quota re-check, the claims
    record_trail       the steps up to `active`, written before the hold
    record_trail       `releasing`, written before the host's teardown
    release_claims     the final state with the release of the claims, then the region's queue walked

`--held` allocations stay active while the others come and go, so the reads see a fleet in use; `--queued` requests
wait in the region's queue meanwhile (an admission pass then runs after every release). Reported per step: the
median and p90 of this process's CPU milliseconds (`time.process_time`, the steps run one at a time, so each
sample is the step's own) and PostgreSQL's CPU per allocation (its processes, from psutil).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from temporalio.testing import ActivityEnvironment

from activities.control.admission import AdmissionActivities
from activities.control.claims import ClaimActivities
from activities.control.placement import PlacementActivities
from activities.control.records import RecordActivities
from bench.cpu import cpu_seconds, process_tree
from bench.database import embedded_database
from bench.fleets import bench_fleet
from contracts.allocation import (
    AllocationRecord,
    AuditTrail,
    ClaimInput,
    EnterQueueInput,
    FindCandidatesInput,
    QueueTicket,
    ReleaseClaimsInput,
    StateChange,
)
from contracts.placement import Bundle, PlacementRequest
from devstack.reports import report_hosts
from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.inventory import InventoryCache

T = TypeVar("T")
REGION = "bench"


class NoClient:
    """The admission pass signals the workflows it wakes; there are none here, and with `--queued` the benchmark's
    queued requests are never woken into placing (they wait behind a fleet kept full)."""

    def get_workflow_handle(self, workflow_id: str) -> Any:
        raise RuntimeError(f"no Temporal in this benchmark: {workflow_id} would be signalled")


def _bundle(node: str, index: int) -> Bundle:
    return Bundle(
        slot_id=f"{node}/{index}",
        slot_index=index,
        gpu_pci=f"0000:{index + 16:02x}:00.0",
        fabric_parent_pci=None,
        fabric_vf_pci=None,
        nvme_device=None,
        numa_node=index // 4,
        vcpu_count=8,
        memory_mib=65536,
        mac_address=None,
        private_ip=None,
    )


class Steps:
    """The control activities, as the control worker builds them (one inventory cache shared)."""

    def __init__(self, sessions: Any) -> None:
        inventory = InventoryCache()
        self.admission = AdmissionActivities(sessions, NoClient(), inventory)  # type: ignore[arg-type]
        self.placement = PlacementActivities(sessions, inventory)
        self.claims = ClaimActivities(sessions, self.admission)
        self.records = RecordActivities(sessions)
        self.env = ActivityEnvironment()
        self.cpu: dict[str, list[float]] = defaultdict(list)

    async def timed(self, name: str, step: Callable[[Any], Awaitable[T]], argument: Any) -> T:
        started = time.process_time()
        result = await self.env.run(step, argument)
        self.cpu[name].append(1000 * (time.process_time() - started))
        return result


class Allocation:
    """One allocation's trail, as its workflow collects it between control steps."""

    def __init__(self, tenant: str) -> None:
        self.id = f"steps-{uuid.uuid4().hex[:10]}"
        self.tenant = tenant
        self.request = PlacementRequest(gpu_count=1, tenant=tenant)
        self.node: str | None = None
        self.pool: str | None = None
        self.slot: int | None = None

    def change(self, state: str, step: str, **fields: Any) -> StateChange:
        return StateChange(
            allocation_id=self.id,
            run_id="bench",
            state=state,
            step=step,
            node=self.node,
            region=REGION,
            pool=self.pool,
            at=datetime.now(UTC),
            **fields,
        )

    def trail(self, *steps: tuple[str, str], opening: bool = False) -> AuditTrail:
        record = (
            AllocationRecord(
                allocation_id=self.id, tenant=self.tenant, request=self.request, workflow_id=f"allocation/{self.id}"
            )
            if opening
            else None
        )
        return AuditTrail(opening=record, changes=[self.change(state, step) for state, step in steps])


async def place(steps: Steps, a: Allocation, used: dict[str, set[int]]) -> None:
    asked = FindCandidatesInput(
        allocation_id=a.id,
        request=a.request,
        region="",
        trail=a.trail(("placing", "select_region"), opening=True),
        final=a.change("failed", "failed"),
    )
    choice = await steps.timed("choose_placement", steps.placement.choose_placement, asked)
    assert choice.candidates is not None and choice.candidates.candidates, choice.refusal()
    first = choice.candidates.candidates[0]
    a.node, a.pool = first.node, first.pool
    index = a.slot = min(set(range(8)) - used[first.node])
    used[first.node].add(index)
    claim = ClaimInput(
        allocation_id=a.id,
        attempt=1,
        node=first.node,
        tenant=a.tenant,
        gpu_count=1,
        bundles=[_bundle(first.node, index)],
        trail=a.trail(("placing", "find_candidates"), ("planning", "plan_bundles"), ("claiming", "record_claims")),
    )
    await steps.timed("record_claims", steps.claims.record_claims, claim)
    active = a.trail(("provisioning", "create_vm"), ("waiting_ready", "wait_ready"), ("active", "ready"))
    await steps.timed("record_trail (active)", steps.records.record_trail, active)


async def release(steps: Steps, a: Allocation, used: dict[str, set[int]]) -> None:
    await steps.timed("record_trail (releasing)", steps.records.record_trail, a.trail(("releasing", "release")))
    given_back = ReleaseClaimsInput(allocation_id=a.id, walk_region=REGION, trail=a.trail(("released", "released")))
    await steps.timed("release_claims", steps.claims.release_claims, given_back)
    assert a.node is not None
    used[a.node].discard(a.slot)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-steps-") as home:
        async with embedded_database(Path(home) / "pg", pool_size=5) as database:
            sessions = database.sessions
            fleet = parse_fleet([("fleet.yaml", bench_fleet(args.nodes))])
            async with sessions.begin() as session:
                await apply_fleet(session, fleet, prune=True)
            await report_hosts(sessions, fleet)
            steps = Steps(sessions)
            used: dict[str, set[int]] = defaultdict(set)
            held = [Allocation("bench") for _ in range(args.held)]
            for a in held:
                await place(steps, a, used)
            for _ in range(args.queued):  # requests that wait for capacity: every release's pass judges them
                waiting = Allocation("bench")
                entry = EnterQueueInput(
                    allocation_id=waiting.id,
                    tenant="bench",
                    region=REGION,
                    request=waiting.request.model_copy(update={"gpu_count": 16}),
                    ticket=QueueTicket(priority=0),
                    deadline_at=datetime.now(UTC) + timedelta(hours=1),
                    reason="bench",
                    code="insufficient_capacity",
                    trail=waiting.trail(("queued", "enter_queue"), opening=True),
                )
                await steps.admission.enter_queue(entry)
            steps.cpu.clear()
            assert database.server.process is not None
            postmaster = database.server.process.pid

            def postgres_cpu() -> float:
                return cpu_seconds(process_tree(postmaster), reaped_by=[postmaster])

            pg_before, wall = postgres_cpu(), time.perf_counter()
            for _ in range(args.allocations):
                a = Allocation("bench")
                await place(steps, a, used)
                await release(steps, a, used)
            pg_ms = 1000 * (postgres_cpu() - pg_before) / args.allocations
            wall_ms = 1000 * (time.perf_counter() - wall) / args.allocations

    print(
        f"\n{args.allocations} allocations, one at a time, {args.nodes} nodes x 8 GPUs, {args.held} held, "
        f"{args.queued} queued; milliseconds of this process's CPU per step\n"
    )
    print("| step | median | p90 |")
    print("|---|---:|---:|")
    total = 0.0
    for name, samples in steps.cpu.items():
        median = statistics.median(samples)
        total += median
        p90 = statistics.quantiles(samples, n=10)[-1]
        print(f"| {name} | {median:.2f} | {p90:.2f} |")
    print(f"| total (sum of medians) | {total:.2f} | |")
    print(f"\nPostgreSQL CPU per allocation: {pg_ms:.2f} ms; wall time per allocation: {wall_ms:.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--allocations", type=int, default=300)
    parser.add_argument("--held", type=int, default=200)
    parser.add_argument("--queued", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
