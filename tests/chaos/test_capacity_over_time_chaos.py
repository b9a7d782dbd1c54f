"""Ends, preemption and reservations under kill -9 of the control worker: an allocation in its preemption
grace period, an allocation reaching its end, and a reservation reaching its start and then its end each survive a
SIGKILL of `berth worker control` (its own process, as `berth up` runs it): the victim is preempted once and its node
goes to the preemptor alone, the leased allocation expires once, the reservation becomes one allocation on its node
(the spot allocation there preempted once) which expires once, and nothing is claimed twice or left behind. The
timers are Temporal's: a new worker picks them up."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from contracts.allocation import Lease
from contracts.placement import PlacementRequest
from store import reservations
from store.models import AllocationRow, ReservationRow
from tests.chaos.test_queue_chaos import _entries, _namer, _release_and_wait, _until, control_process
from tests.workflows.lab import FAST, Lab, lab_fleet, running_lab
from workflows.allocation.messages import QueueWait
from workflows.reservation.client import start_reservation

Row = TypeVar("Row", AllocationRow, ReservationRow)

CLASSES = [
    {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "spot"},
        "spec": {"value": 0, "preemptible": True, "gracePeriod": "3s"},
    },
    {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "urgent"},
        "spec": {"value": 100},
    },
]
FLEET = lab_fleet({"only": {"gpus": 6}}, extra=CLASSES)
WARNED_AT_ONCE = FAST.model_copy(update={"expiry_warning_seconds": 60})


async def _row_until(lab: Lab, allocation_id: str, state: str, timeout: float = 45.0) -> AllocationRow:
    """Wait until the allocation's row is in `state` (a closed workflow answers no status query: the row does)."""
    return await _in_state(lab, AllocationRow, allocation_id, state, timeout)


async def _reservation_until(lab: Lab, reservation_id: str, state: str, timeout: float = 45.0) -> ReservationRow:
    return await _in_state(lab, ReservationRow, reservation_id, state, timeout)


async def _in_state(lab: Lab, model: type[Row], key: str, state: str, timeout: float) -> Row:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with lab.sessions() as session:
            row = await session.get(model, key)
        if row is not None and row.state == state:
            return row
        assert asyncio.get_running_loop().time() < deadline, f"{key} is {row and row.state}, not {state}"
        await asyncio.sleep(0.1)


async def _reserve(lab: Lab, gpus: int, node: str, starts: datetime, ends: datetime) -> str:
    """A reservation as the API leaves an admitted one (api/routes/reservations.py): its row, then its workflow."""
    reservation_id = f"r-{uuid.uuid4().hex[:8]}"
    async with lab.sessions.begin() as session:
        await reservations.create(
            session,
            ReservationRow(
                id=reservation_id,
                tenant="acme",
                region="lab",
                node_id=node,
                gpu_count=gpus,
                gpu_product=None,
                shape="gpu_slice",
                starts_at=starts,
                ends_at=ends,
                state="reserved",
            ),
        )
    request = PlacementRequest(gpu_count=gpus, tenant="acme", region="lab")
    await start_reservation(lab.starter, reservation_id, "acme", node, request, starts, ends, FAST, lab.queues)
    return reservation_id


async def _holding_exactly(lab: Lab, holders: set[str]) -> None:
    """Exactly `holders` claim GPUs, each its own and placed once (one `ready` in its story); no slot is claimed
    twice; the busy slots are theirs, and so are the VMs."""
    claims = await lab.active_claims()
    assert set(claims) == holders, claims
    for allocation_id in holders:
        trail = [step for step, _state, _node, _reason in await lab.events(allocation_id)]
        assert trail.count("ready") == 1, trail
    assert await lab.double_claims() == 0
    busy = sorted(slot for slot, state in (await lab.slot_states()).items() if state != "available")
    assert busy == sorted(slot for slots in claims.values() for slot in slots)
    assert sorted(p.stem for p in lab.vm_records()) == sorted(holders)


async def test_a_preemption_in_its_grace_period_and_an_end_survive_kill_9_of_the_control_worker(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    n = _namer()
    spot, urgent, leased = n("spot"), n("urgent"), n("leased")
    async with (
        running_lab(temporal_client, temporal_client, sessions, tmp_path, FLEET, control=False) as lab,
        control_process(lab, database_url, reconcile_every=3600) as control,
    ):
        await lab.allocate(spot, gpus=4, request_body={"priority_class": "spot"})
        await _until(lab, spot, ("active",))

        # 1. The victim in its grace period when the worker dies: it is preempted once, after its grace.
        await lab.allocate(urgent, gpus=4, queue=QueueWait(timeout_seconds=600, priority=100, priority_class="urgent"))
        await _row_until(lab, spot, "preempting")
        await control.kill()
        await control.start()
        await _row_until(lab, spot, "preempted")
        await _until(lab, urgent, ("active",))
        await _holding_exactly(lab, {urgent})
        steps = [step for step, _state, _node, _reason in await lab.events(spot)]
        assert steps.count("preempt_notice") == 1 and steps.count("preempted") == 1, steps

        # 2. An allocation's end passes while no worker runs: the new one expires it, once. Read from PostgreSQL: a
        # short lease may end before a status query would see it active.
        await lab.allocate(leased, gpus=2, timing=WARNED_AT_ONCE, lease=Lease(duration_seconds=4))
        ends_at = (await _row_until(lab, leased, "active")).ends_at
        assert ends_at is not None
        await control.kill()
        await asyncio.sleep(max(0.0, (ends_at - datetime.now(UTC)).total_seconds()) + 0.5)
        await control.start()
        await _row_until(lab, leased, "expired")
        trail = [step for step, _state, _node, _reason in await lab.events(leased)]
        assert trail.count("expire") == 1 and trail.count("expired") == 1, trail
        await _holding_exactly(lab, {urgent})
        assert await _entries(lab) == {}
        await _release_and_wait(lab, urgent)
        assert await lab.active_claims() == {} and lab.vm_records() == []


async def test_a_reservations_start_and_end_survive_kill_9_of_the_control_worker(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    spot = _namer()("spot")
    async with (
        running_lab(temporal_client, temporal_client, sessions, tmp_path, FLEET, control=False) as lab,
        control_process(lab, database_url, reconcile_every=3600) as control,
    ):
        await lab.allocate(spot, gpus=4, request_body={"priority_class": "spot"})
        await _until(lab, spot, ("active",))
        starts = datetime.now(UTC) + timedelta(seconds=5)
        reservation = await _reserve(lab, 4, "only", starts, starts + timedelta(seconds=15))

        # 1. Its start passes while no worker runs: the new one starts it once, preempting the spot allocation once.
        await control.kill()
        await asyncio.sleep(max(0.0, (starts - datetime.now(UTC)).total_seconds()) + 0.5)
        await control.start()
        allocation = (await _reservation_until(lab, reservation, "started")).allocation_id
        assert allocation is not None
        await _row_until(lab, spot, "preempted")
        row = await _row_until(lab, allocation, "active")
        assert row.node_id == "only" and row.ends_at == starts + timedelta(seconds=15)
        await _holding_exactly(lab, {allocation})
        steps = [step for step, _state, _node, _reason in await lab.events(spot)]
        assert steps.count("preempt_notice") == 1 and steps.count("preempted") == 1, steps

        # 2. Its end passes while no worker runs: the new one expires its allocation, once, and the reservation ends.
        await control.kill()
        await asyncio.sleep(max(0.0, (row.ends_at - datetime.now(UTC)).total_seconds()) + 0.5)
        await control.start()
        await _row_until(lab, allocation, "expired")
        ended = await _reservation_until(lab, reservation, "ended")
        assert ended.allocation_id == allocation
        trail = [step for step, _state, _node, _reason in await lab.events(allocation)]
        assert trail.count("ready") == 1 and trail.count("expired") == 1, trail
        assert await lab.active_claims() == {} and lab.vm_records() == []
        assert await lab.double_claims() == 0 and await _entries(lab) == {}
