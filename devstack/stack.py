"""`berth up`: the whole development stack on this machine, each part its own supervised process.

    lock state dir -> postgres -> migrations + fleet applied -> temporal -> tokens (node tokens to files)
      -> control-worker (or `control_workers` of them: control-worker, control-worker-2, ...) + api (or
         `api_processes` of them behind one loopback address: balancer.py) + gateway
         + agents (one process, or `agent_processes` of them; they reach Temporal only through the gateway)
      -> context.json

Every part is a child of the supervisor (supervisor.py), which restarts one that dies on the same port and data
directory, so context.json stays true. A second `berth up` while one runs finds the lock held and reuses the
running stack instead of starting another.

Tests drive the same object in-process (the chaos tests kill parts by pid):

    stack = DevStack(settings, fleet_file, say=..., agent_processes=2)
    context = stack.start()                       # StackContext, also written to context.json
    stack.parts()  stack.pid(part)  stack.restarts(part)  stack.ended_serving(part)
    stack.wait_ready(part, timeout)  stack.stop()
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from config.context import StackContext, read_context, write_context
from config.settings import Settings
from devstack import parts, real_vms
from devstack.balancer import LoopbackBalancer
from devstack.ports import free_port
from devstack.postgres import EmbeddedPostgres, PostgresStartError
from devstack.real_vms import RealVmHost
from devstack.supervisor import Backoff, PartFailed, Supervisor
from devstack.temporal import DevTemporal
from devstack.tokens import gateway_key, issue_tokens, write_token_files
from fleet.loader import load_fleet
from store.apply import ApplyResult, apply_fleet
from store.db import create_engine, session_factory
from store.migrate import upgrade

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_fleet_file() -> Path:
    return REPO_ROOT / "examples" / "fleet.yaml"


def real_vms_fleet_file() -> Path:
    """One host whose VMs are real (`berth up --real-vms`)."""
    return REPO_ROOT / "examples" / "real-vms" / "fleet.yaml"


class AlreadyRunning(RuntimeError):
    def __init__(self, context: StackContext | None) -> None:
        self.context = context
        super().__init__("a dev stack is already running for this state directory")


async def prepare_database(url: str, fleet_file: Path) -> ApplyResult:
    """Migrate to the newest schema and apply the fleet file (both idempotent)."""
    fleet = load_fleet([fleet_file])
    engine = create_engine(url, pool_size=2)
    try:
        await upgrade(engine)
        async with session_factory(engine).begin() as session:
            return await apply_fleet(session, fleet)
    finally:
        await engine.dispose()


@dataclass
class DevStack:
    settings: Settings
    fleet_file: Path
    say: Callable[[str], None] = print
    agent_processes: int = 1
    control_workers: int = 1
    api_processes: int = 1
    backoff: Backoff = field(default_factory=Backoff)
    start_timeout: float = 90.0
    # The fleet's hosts run real VMs on this machine's libvirt (devstack/real_vms.py); their GPUs stay bookkeeping.
    real_vms: bool = False
    accelerator: str | None = None  # the real VMs' (kvm, tcg; default BERTH_REAL_VMS_ACCELERATOR, else auto)
    skipped: list[str] = field(default_factory=list)  # hosts with no agent (agentDown in the fleet)
    _real_vms: RealVmHost | None = None
    _supervisor: Supervisor | None = None
    _context: StackContext | None = None
    _lock: IO[str] | None = None
    _balancer: LoopbackBalancer | None = None

    def _take_lock(self) -> None:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.settings.state_dir / "up.lock", "a+")  # held (and flock-ed) for the stack's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise AlreadyRunning(read_context(self.settings)) from None
        self._lock = lock

    def start(self) -> StackContext:
        self._take_lock()
        state = self.settings.state_dir.resolve()
        fleet_file = self.fleet_file.resolve()
        supervisor = self._supervisor = Supervisor(state / "logs" / "supervisor.log", self.say, self.backoff)
        supervisor.start()
        try:
            self.say("starting PostgreSQL ...")
            postgres = self._start_postgres(state / "postgres")
            self.say("migrating the schema and applying the fleet ...")
            result = asyncio.run(prepare_database(postgres.url, fleet_file))
            self.say(f"fleet {self.fleet_file}: {result.summary()}")
            self.say("starting the Temporal dev server and UI ...")
            temporal = DevTemporal(state / "temporal", namespace=self.settings.temporal_namespace)
            self._run(parts.temporal_part(temporal))
            nodes = self._agent_nodes(fleet_file)
            if self.real_vms:
                self._real_vms = real_vms.prepare(fleet_file, state, self.say, self.accelerator)
            admin_token, tenant_tokens, node_tokens = asyncio.run(issue_tokens(postgres.url, nodes))
            token_dir = write_token_files(state / "tokens", node_tokens)
            api_url = f"http://127.0.0.1:{free_port()}"
            gateway = f"127.0.0.1:{free_port()}"
            env = parts.child_env(
                self.settings,
                BERTH_STATE_DIR=str(state),
                BERTH_FLEET_FILE=str(fleet_file),
                BERTH_DATABASE_URL=postgres.url,
                BERTH_TEMPORAL_ADDRESS=temporal.address,
                BERTH_TEMPORAL_NAMESPACE=temporal.namespace,
                BERTH_API_URL=api_url,
                # The console's links to each allocation's workflow open this stack's own Temporal UI.
                BERTH_TEMPORAL_UI_URL=temporal.ui_url,
                BERTH_GATEWAY_LISTEN=gateway,
                BERTH_GATEWAY_KEY_FILE=str(gateway_key(state)),
                BERTH_NODE_GATEWAY=gateway,
            )
            self.say("starting the control worker(s), the API and the node agents ...")
            workers = parts.control_worker_parts(self.control_workers, state, env)
            for part in workers:
                supervisor.add(part)
            apis = self._apis(int(api_url.rsplit(":", 1)[1]), state, env)
            for part in apis:
                supervisor.add(part)
            supervisor.add(parts.gateway_part(state, env))
            groups = parts.agent_groups(nodes, self.agent_processes)
            libvirt_config = self._real_vms.config_file if self._real_vms else None
            for name, group in groups.items():  # started beside the API: they report as soon as it answers
                supervisor.add(parts.agents_part(name, group, fleet_file, token_dir, state, env, libvirt_config))
            self._wait(*(part.name for part in workers), *(part.name for part in apis), parts.GATEWAY, *groups)
            down = f" (no agent for {', '.join(self.skipped)}: agentDown in the fleet)" if self.skipped else ""
            self.say(f"{len(nodes)} node agents running in {len(groups)} process(es){down}")
        except BaseException:
            self.stop()
            raise
        self._context = StackContext(
            temporal_address=temporal.address,
            temporal_namespace=temporal.namespace,
            temporal_ui_url=temporal.ui_url,
            database_url=postgres.url,
            api_url=api_url,
            gateway_address=gateway,
            admin_token=admin_token,
            tenant_tokens=tenant_tokens,
            pid=os.getpid(),
        )
        self._record_pids()
        supervisor.on_change = self._record_pids
        return self._context

    def _apis(self, port: int, state: Path, env: dict[str, str]) -> list[parts.Part]:
        """One API on `port`, or `api_processes` of them (`api`, `api-2`, ...) on ports of their own behind a
        loopback balancer on `port`, so every client keeps the one address."""
        if self.api_processes == 1:
            return [parts.api_part(port, state, env)]
        ports = [free_port() for _ in range(self.api_processes)]
        names = [parts.API, *(f"{parts.API}-{n}" for n in range(2, self.api_processes + 1))]
        self._balancer = LoopbackBalancer(port, ports).start()
        return [parts.api_part(p, state, env, name) for p, name in zip(ports, names, strict=True)]

    def _start_postgres(self, data_dir: Path) -> EmbeddedPostgres:
        server = EmbeddedPostgres(data_dir, password_file=data_dir.parent / "postgres.password")
        user = server.prepare()
        foreign = server.running_pid()
        deadline = time.monotonic() + 15
        while foreign is not None and time.monotonic() < deadline:  # say, the last stack's, still shutting down
            time.sleep(0.2)
            foreign = server.running_pid()
        if foreign is not None:
            raise PostgresStartError(
                f"a PostgreSQL server (pid {foreign}) that this stack did not start already runs on {data_dir}; "
                "stop it first"
            )
        server.port = free_port()
        self._run(parts.postgres_part(server, user))
        server.ensure_database()
        return server

    def _run(self, part: parts.Part) -> None:
        assert self._supervisor is not None
        self._supervisor.add(part)
        self._wait(part.name)

    def _wait(self, *names: str) -> None:
        assert self._supervisor is not None
        for name in names:
            self._supervisor.wait_ready(name, self.start_timeout, starting=True)

    def _agent_nodes(self, fleet_file: Path) -> list[str]:
        """Every host of the fleet that gets a simulated agent; the others are remembered in `skipped`."""
        nodes, self.skipped = [], []
        for pool in load_fleet([fleet_file]).host_pools():
            for node in pool.nodes:
                (self.skipped if node.simulation.agent_down else nodes).append(node.name)
        return nodes

    def _record_pids(self) -> None:
        """context.json names each part's current pid, so an operator can find (or kill -9) one by hand."""
        if self._context is None or self._supervisor is None:
            return
        self._context = self._context.model_copy(update={"processes": self._supervisor.pids()})
        write_context(self.settings, self._context)

    # -- what the chaos tests use --------------------------------------------------------------------------------

    @property
    def context(self) -> StackContext | None:
        return self._context

    def parts(self) -> list[str]:
        """The supervised parts in start order: postgres, temporal, control-worker, api, agents (or agents-<k>)."""
        return self._supervisor.parts() if self._supervisor else []

    def pid(self, part: str) -> int | None:
        """The live pid of `part`, None while it is down (between its death and its restart)."""
        return self._supervisor.pid(part) if self._supervisor else None

    def restarts(self, part: str) -> int:
        """How many times the supervisor restarted `part`."""
        return self._supervisor.restarts(part) if self._supervisor else 0

    def ended_serving(self, part: str) -> int:
        """How many times `part` ended after it was seen ready (not counting restarts that failed to start)."""
        return self._supervisor.ended_serving(part) if self._supervisor else 0

    def wait_ready(self, part: str, timeout: float = 60.0, *, replacing: int | None = None) -> int:
        """Return `part`'s pid once it runs and is ready again. Give the pid you just killed as `replacing`, so the
        dying process is never mistaken for its replacement. Raises PartFailed after `timeout` seconds."""
        if self._supervisor is None:
            raise PartFailed("the stack is not running")
        return self._supervisor.wait_ready(part, timeout, replacing=replacing)

    def stop(self) -> None:
        """Stop every part, newest first; forget the context so no command points at the stopped stack."""
        if self._supervisor is not None:
            self._supervisor.stop()
            self._supervisor = None
        if self._real_vms is not None:  # after the agents: none is left to make a VM while they go
            self._real_vms.teardown(self.say)
            self._real_vms = None
        if self._balancer is not None:
            self._balancer.stop()
            self._balancer = None
        self.settings.context_file.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
