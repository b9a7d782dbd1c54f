"""Queues under kill -9: requests waiting for capacity survive a SIGKILL of the control worker
and of PostgreSQL, before and during the admission pass that frees capacity for them, and each is placed exactly
once.

The control worker is `berth worker control` as its own process (as `berth up` runs it) on the lab's task queues,
with the reconciler's Schedule under an id of its own. PostgreSQL, for the test that kills it, is an embedded server
of the test's own (the session's shared one must outlive every test), restarted on the same data directory and port
as `berth up`'s supervisor restarts it. What is checked is what a user and a platform team would see: the
allocation's state, its queue entry, the active claims (each placed allocation's exactly its own GPUs, no slot
claimed twice), the slots and the VMs on the hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from contracts.allocation import PLACING_STATES
from devstack.ports import free_port
from devstack.postgres import EmbeddedPostgres
from devstack.process import alive, as_user, clear_session
from devstack.ready import is_marked_ready
from store import queue
from store.db import create_engine, session_factory
from store.migrate import upgrade
from store.outage import is_database_outage
from tests.workflows.lab import Lab, lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import AllocationStatus, QueueWait
from workflows.client_calls import WorkerUnavailable

# Starts processes of its own (a stack, a CLI run): never in the quick tier (tests/tiers.py).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WAIT = QueueWait(timeout_seconds=600)
T = TypeVar("T")


# -- the parts that are killed -------------------------------------------------------------------------------------


@dataclass
class ControlProcess:
    """`berth worker control` as its own process: started, killed with SIGKILL, started again."""

    lab: Lab
    database_url: str
    reconcile_every: float  # the reconciler Schedule's interval (60 s in production)
    schedule_id: str = field(default_factory=lambda: f"test-reconciler-{uuid.uuid4().hex[:8]}")
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    pids: list[int] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            **{name: value for name, value in os.environ.items() if not name.startswith("BERTH_")},
            "BERTH_DATABASE_URL": self.database_url,
            "BERTH_TEMPORAL_ADDRESS": self.lab.worker_client.service_client.config.target_host,
            "BERTH_TEMPORAL_NAMESPACE": self.lab.worker_client.namespace,
            "BERTH_CONTROL_TASK_QUEUE": self.lab.queues.control,
            "BERTH_NODE_TASK_QUEUE_PREFIX": self.lab.queues.node_prefix,
            "BERTH_STATE_DIR": str(self.lab.home),
            "BERTH_RECONCILER_SCHEDULE_ID": self.schedule_id,
            "BERTH_RECONCILER_EVERY_SECONDS": str(self.reconcile_every),
            "BERTH_RECONCILER_AGENT_PICKUP_SECONDS": "1",
        }

    @property
    def log(self) -> Path:
        return self.lab.home / "control.log"

    async def start(self, timeout: float = 60.0) -> None:
        """Start one and wait until it serves (its ready file names its pid)."""
        self.starts += 1
        ready = self.lab.home / "run" / f"control-{self.starts}.ready"
        command = [sys.executable, "-m", "cli.main", "worker", "control", "--ready-file", str(ready)]
        process = _spawn(command, self.log, env=self.env(), cwd=REPO)
        self.process, self.pids = process, [*self.pids, process.pid]
        deadline = time.monotonic() + timeout
        while not is_marked_ready(ready, process.pid):
            assert process.poll() is None, f"the control worker exited: {self.tail()}"
            assert time.monotonic() < deadline, f"the control worker did not serve within {timeout:g}s: {self.tail()}"
            await asyncio.sleep(0.1)

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye, the process is simply gone."""
        assert self.process is not None and self.process.poll() is None, "the control worker is not running"
        self.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.process.wait)

    async def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.process.wait, 30)
            except Exception:  # noqa: BLE001 - whatever kept it, it must not outlive the test
                self.process.kill()
                await asyncio.to_thread(self.process.wait)

    async def forget_schedule(self) -> None:
        """The reconciler's Schedule goes with the test, and any run of it still open (its worker is gone)."""
        handle = self.lab.worker_client.get_schedule_handle(self.schedule_id)
        with contextlib.suppress(Exception):  # never created (the worker did not start)
            running = (await handle.describe()).info.running_actions
            await handle.delete()
            for action in running:
                with contextlib.suppress(Exception):
                    await self.lab.worker_client.get_workflow_handle(
                        action.workflow_id, run_id=action.first_execution_run_id
                    ).terminate("the test is over")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else "(no log)"


@dataclass
class OwnPostgres:
    """An embedded PostgreSQL of the test's own, killed with SIGKILL and restarted on the same data and port.

    `durable=False` (fsync off) loses nothing to a process kill: what was committed is in the kernel's page cache,
    which outlives the process; only a machine crash needs fsync."""

    data_dir: Path
    server: EmbeddedPostgres | None = None
    pids: list[int] = field(default_factory=list)

    async def start(self, timeout: float = 60.0) -> None:
        """`EmbeddedPostgres.start`, on the port it had before (a client's URL stays right), but spawned without
        `devstack.process.spawn`'s pre-exec hook."""
        server = EmbeddedPostgres(self.data_dir, port=self.server.port if self.server else 0, durable=False)
        user = await asyncio.to_thread(server.prepare)
        await asyncio.to_thread(server.clear_stale_pid_file)  # a postmaster killed with -9 leaves its pid file
        server.port = server.port or free_port()
        self.server = server
        deadline = time.monotonic() + timeout
        server.process = _spawn(server.command(), server.log_file, user=user)
        self.pids.append(server.process.pid)
        while not await asyncio.to_thread(server.is_ready) and server.process.poll() is None:
            assert time.monotonic() < deadline, f"PostgreSQL did not accept connections within {timeout:g}s"
            await asyncio.sleep(0.1)
        assert server.process.poll() is None, server.log_file.read_text(errors="replace")[-2000:]
        await asyncio.to_thread(server.ensure_database)

    async def kill(self) -> None:
        """SIGKILL the postmaster; its children notice and exit by themselves (`start` waits for them to let go of
        its shared memory: each leads a session of its own, so waiting on the postmaster's finds none of them)."""
        assert self.server is not None and self.server.process is not None
        pid = self.server.process.pid
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(self.server.process.wait)
        await asyncio.to_thread(clear_session, pid)

    async def destroy(self) -> None:
        if self.server is not None and self.server.process is not None:
            pid = self.server.process.pid
            await asyncio.to_thread(self.server.stop)
            await asyncio.to_thread(clear_session, pid)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _spawn(
    command: list[str],
    log_file: Path,
    *,
    user: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """`devstack.process.spawn` without its parent-death signal: the fixtures end what they start instead. The user
    is switched as spawn switches it (`as_user`), by the program the child execs: Popen's own `user=` would fork,
    and a child forked from this process, whose gRPC threads run, died of SIGSEGV before it ran PostgreSQL now and
    then."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command, popen_user = as_user(command, user)
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            user=popen_user,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


@pytest.fixture
async def own_postgres(tmp_path: Path) -> AsyncIterator[OwnPostgres]:
    postgres = OwnPostgres(tmp_path / "postgres")
    await postgres.start()
    try:
        yield postgres
    finally:
        await postgres.destroy()
    assert not [pid for pid in postgres.pids if alive(pid)], "a PostgreSQL server outlived the test"


@contextlib.asynccontextmanager
async def control_process(lab: Lab, database_url: str, reconcile_every: float) -> AsyncIterator[ControlProcess]:
    control = ControlProcess(lab, database_url, reconcile_every)
    try:
        await control.start()
        yield control
    except BaseException:
        print(f"control worker log:\n{control.tail()}")
        raise
    finally:
        await control.forget_schedule()
        await control.stop()
        assert not [pid for pid in control.pids if alive(pid)], "a control worker outlived the test"


# -- what a user and a platform team see ---------------------------------------------------------------------------


def _namer() -> Callable[[str], str]:
    """Allocation ids unique to one test: the Temporal server outlives it, and a released id is not reused."""
    tag = uuid.uuid4().hex[:6]
    return lambda name: f"{name}-{tag}"


async def _despite_outage(read: Callable[[], Awaitable[T]], patience: float = 60.0) -> T:
    """Read, waiting out PostgreSQL's return: right after a kill the pooled connections are dead once."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return await read()
        except Exception as error:
            if not is_database_outage(error) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _state(lab: Lab, allocation_id: str) -> AllocationStatus | None:
    """The workflow's own account; None while no control worker answers in time (one was just killed)."""
    try:
        return await allocation_client.status(lab.starter, allocation_id, wait_seconds=5)
    except (WorkerUnavailable, TimeoutError):
        return None


async def _until(lab: Lab, allocation_id: str, states: tuple[str, ...], timeout: float = 45.0) -> AllocationStatus:
    deadline = time.monotonic() + timeout
    status = None
    while True:
        status = await _state(lab, allocation_id) or status
        if status is not None and status.state in states:
            return status
        assert time.monotonic() < deadline, f"{allocation_id} stayed {status and status.state} (wanted {states})"
        await asyncio.sleep(0.1)


async def _entries(lab: Lab) -> dict[str, queue.QueueEntry]:
    async def read() -> dict[str, queue.QueueEntry]:
        async with lab.sessions() as session:
            return {e.allocation_id: e for e in await queue.entries(session)}

    return await _despite_outage(read)


async def _release(lab: Lab, allocation_id: str) -> None:
    """`berth alloc release`: accepted once the allocation's workflow takes it (it tears down after that)."""
    assert (await allocation_client.release(lab.starter, allocation_id, wait_seconds=30)).state == "active"


async def _release_and_wait(lab: Lab, allocation_id: str) -> None:
    await _release(lab, allocation_id)
    final = await asyncio.wait_for(allocation_client.handle(lab.starter, allocation_id).result(), 60)
    assert final.state == "released"


async def _placed_exactly_once(lab: Lab, placed: set[str]) -> None:
    """Each of `placed` active, actively claiming exactly the GPUs it was given, on one VM; nothing else claimed, no
    slot claimed twice, every other slot available; none of them left in a queue."""
    claims = await _despite_outage(lab.active_claims)
    assert set(claims) == placed, claims
    for allocation_id in placed:
        status = await _until(lab, allocation_id, ("active",), timeout=10)
        given = sorted(f"{status.node}/{b.slot_index}" for b in status.bundles)
        assert sorted(claims[allocation_id]) == given, (allocation_id, claims[allocation_id], given)
        assert [a.outcome for a in status.attempts] == ["succeeded"], status.attempts
        trail = await _despite_outage(lambda a=allocation_id: lab.events(a))
        assert [state for _step, state, _node, _reason in trail].count("active") == 1, trail  # its story, once
    assert await _despite_outage(lab.double_claims) == 0
    busy = sorted(slot for slot, state in (await _despite_outage(lab.slot_states)).items() if state != "available")
    assert busy == sorted(slot for slots in claims.values() for slot in slots)
    assert sorted(p.stem for p in lab.vm_records()) == sorted(placed)
    assert not placed & set(await _entries(lab))


async def _nothing_left(lab: Lab, released: list[str]) -> None:
    for allocation_id in released:
        await _release_and_wait(lab, allocation_id)
    assert await _despite_outage(lab.active_claims) == {}
    assert await _entries(lab) == {}
    assert set((await _despite_outage(lab.slot_states)).values()) == {"available"}
    assert lab.vm_records() == [] and lab.lease_files() == []


async def _queue_behind_holders(lab: Lab, n: Callable[[str], str], count: int) -> list[str]:
    """`count` holders of 2 GPUs fill the node, then `count` requests of 2 GPUs that may wait are queued."""
    holders = [await lab.allocate(n(f"holder-{k}"), gpus=2) for k in range(count)]
    for holder in holders:
        await _until(lab, holder.id.removeprefix("allocation/"), ("active",))
    waiting = []
    for k in range(count):
        await lab.allocate(n(f"waiter-{k}"), gpus=2, queue=WAIT)
        waiting.append(n(f"waiter-{k}"))
        await _until(lab, n(f"waiter-{k}"), ("queued",))
    entries = await _entries(lab)
    assert sorted(entries) == sorted(waiting)
    assert all(entries[w].code == "insufficient_capacity" for w in waiting)
    assert [w for w in sorted(entries, key=lambda a: entries[a].arrival)] == waiting  # arrival order
    return waiting


@contextlib.asynccontextmanager
async def _pass_held_at_its_first_write(lab: Lab) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Every queue entry locked (`SELECT ... FOR UPDATE`) in a transaction of the test's own: the next admission
    pass takes its region's lock, reads the queue and then waits at its first write (forgetting what the last pass
    set aside) until this transaction ends. Yields `caught()`, which returns once a pass waits there. The
    transaction ends on leaving (rolled back, or gone with PostgreSQL)."""

    async def caught(timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            async with lab.sessions() as watcher:
                waiting = await watcher.scalar(WAITING_PASS)
            if waiting:
                return
            assert time.monotonic() < deadline, f"no admission pass reached its first write within {timeout:g}s"
            await asyncio.sleep(0.02)

    session = lab.sessions()
    try:
        await session.execute(text("SELECT allocation_id FROM queue_entries FOR UPDATE"))
        yield caught
    finally:
        with contextlib.suppress(Exception):  # PostgreSQL may have been killed under it
            await session.rollback()
        with contextlib.suppress(Exception):
            await session.close()


WAITING_PASS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
    "AND query LIKE 'UPDATE queue_entries SET node=%'"
)


async def _refused(sessions: async_sessionmaker[AsyncSession]) -> None:
    """PostgreSQL is really gone: a statement fails as an outage does."""
    with pytest.raises(Exception) as refused:  # noqa: B017 - which class depends on where the connection broke
        async with sessions() as session:
            await session.execute(text("SELECT 1"))
    assert is_database_outage(refused.value), refused.value


def _arrivals(entries: dict[str, queue.QueueEntry]) -> dict[str, int]:
    return {allocation_id: entry.arrival for allocation_id, entry in entries.items()}


# -- the tests -------------------------------------------------------------------------------------------------------

# One node of 6 GPUs (2 s from VM create to ready, so a placement can be caught in the middle), three holders of 2.
FLEET = lab_fleet({"only": {"gpus": 6, "simulation": {"bootSeconds": 2}}})


async def test_queued_requests_survive_kill_9_of_the_control_worker_and_are_placed_once(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    """Killed (1) while requests wait, (2) in the middle of the admission pass a release runs, (3) while a woken
    request places itself. The reconciler's Schedule is made too rare to help: each request is placed by the pass
    of the release that freed its GPUs (in 2, the release's step run again by the new worker, pass included)."""
    n = _namer()
    async with (
        running_lab(temporal_client, temporal_client, sessions, tmp_path, FLEET, control=False) as lab,
        control_process(lab, database_url, reconcile_every=3600) as control,
    ):
        waiting = await _queue_behind_holders(lab, n, 3)
        before = _arrivals(await _entries(lab))

        # 1. While they wait: the queue is in PostgreSQL, the waiting in Temporal; a new worker takes over.
        await control.kill()
        await control.start()
        assert [(await _until(lab, w, ("queued",))).state for w in waiting] == ["queued"] * 3
        assert _arrivals(await _entries(lab)) == before
        await _release(lab, n("holder-0"))
        await _until(lab, waiting[0], ("active",))
        await _placed_exactly_once(lab, {n("holder-1"), n("holder-2"), waiting[0]})
        assert _arrivals(await _entries(lab)) == {w: before[w] for w in waiting[1:]}  # the others kept their places

        # 2. In the middle of the pass that the release runs: the region's lock taken, the queue read, the pass's
        # first write waiting on the test's lock; the worker dies with the pass's transaction open.
        async with _pass_held_at_its_first_write(lab) as caught_in_the_pass:
            await _release(lab, n("holder-1"))
            await caught_in_the_pass()
            await control.kill()
        await control.start()
        await _until(lab, waiting[1], ("active",))
        await _placed_exactly_once(lab, {n("holder-2"), waiting[0], waiting[1]})
        assert _arrivals(await _entries(lab)) == {waiting[2]: before[waiting[2]]}

        # 3. While the woken request places itself (its VM takes 2 s to come up).
        await _release(lab, n("holder-2"))
        caught = await _until(lab, waiting[2], PLACING_STATES)
        await control.kill()
        await control.start()
        await _until(lab, waiting[2], ("active",))
        await _placed_exactly_once(lab, set(waiting))
        print(f"killed the control worker while {waiting[2]} was {caught.state} ({caught.step})")

        await _nothing_left(lab, waiting)


async def test_queued_requests_survive_kill_9_of_postgresql_and_are_placed_once(
    temporal_client: Client, own_postgres: OwnPostgres, tmp_path: Path
) -> None:
    """PostgreSQL killed (1) while requests wait, (2) in the middle of the admission pass a release runs, (3) while a
    woken request places itself. A pass that fails in the outage is not retried by the release (the release must not
    be held up): the reconciler's pass is the one that walks the queue then, as it does every minute in production;
    here its Schedule runs every 5 s."""
    n = _namer()
    assert own_postgres.server is not None
    database_url = own_postgres.server.url
    engine = create_engine(database_url, pool_size=5)
    try:
        await upgrade(engine)
        sessions = session_factory(engine)
        async with (
            running_lab(temporal_client, temporal_client, sessions, tmp_path / "lab", FLEET, control=False) as lab,
            control_process(lab, database_url, reconcile_every=5) as _control,
        ):
            waiting = await _queue_behind_holders(lab, n, 3)
            before = _arrivals(await _entries(lab))

            # 1. While they wait.
            await own_postgres.kill()
            await _refused(sessions)
            await own_postgres.start()
            assert _arrivals(await _entries(lab)) == before  # every entry, at its place
            assert [(await _until(lab, w, ("queued",))).state for w in waiting] == ["queued"] * 3
            await _release(lab, n("holder-0"))
            await _until(lab, waiting[0], ("active",))
            await _placed_exactly_once(lab, {n("holder-1"), n("holder-2"), waiting[0]})
            assert _arrivals(await _entries(lab)) == {w: before[w] for w in waiting[1:]}

            # 2. In the middle of the pass that the release runs (as above): the pass's connection is cut, the
            # release goes on (a pass that fails must not hold it up), and the reconciler's pass wakes the request.
            async with _pass_held_at_its_first_write(lab) as caught_in_the_pass:
                await _release(lab, n("holder-1"))
                await caught_in_the_pass()
                await own_postgres.kill()
            await own_postgres.start()
            await _until(lab, waiting[1], ("active",))
            await _placed_exactly_once(lab, {n("holder-2"), waiting[0], waiting[1]})
            assert _arrivals(await _entries(lab)) == {waiting[2]: before[waiting[2]]}

            # 3. While the woken request places itself.
            await _release(lab, n("holder-2"))
            caught = await _until(lab, waiting[2], PLACING_STATES)
            await own_postgres.kill()
            await own_postgres.start()
            await _until(lab, waiting[2], ("active",))
            await _placed_exactly_once(lab, set(waiting))
            print(f"killed PostgreSQL while {waiting[2]} was {caught.state} ({caught.step})")

            await _nothing_left(lab, waiting)
    finally:
        await engine.dispose()
