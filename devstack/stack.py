"""`berth up`: the whole development stack on this machine, started in order and stopped in reverse.

    PostgreSQL (embedded) -> migrations -> fleet applied -> Temporal dev server + UI
      -> control worker + one simulated node agent per host -> HTTP API -> tokens -> context.json

Each piece joins an ordered list and is stopped in reverse order. A second `berth up` while one runs finds
the lock held and reuses the running stack instead of starting another.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from config.context import StackContext, read_context, write_context
from config.settings import Settings
from devstack.ports import free_port
from devstack.postgres import EmbeddedPostgres
from devstack.temporal import DevTemporal
from devstack.workers import WorkerHost
from fleet.loader import load_fleet
from store.apply import ApplyResult, apply_fleet
from store.db import create_engine, session_factory
from store.migrate import upgrade
from store.tokens import DEV_STACK_LABEL, create_token, rotate_dev_stack_tokens

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_fleet_file() -> Path:
    return REPO_ROOT / "examples" / "fleet.yaml"


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


async def issue_tokens(url: str, nodes: list[str]) -> tuple[str, dict[str, str], dict[str, str]]:
    """Admin and tenant tokens for the user; a node token for each simulated agent (kept in memory only)."""
    engine = create_engine(url, pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            admin, tenants = await rotate_dev_stack_tokens(session)
            node_tokens = {
                node: await create_token(session, "node", node=node, label=DEV_STACK_LABEL) for node in nodes
            }
            return admin, tenants, node_tokens
    finally:
        await engine.dispose()


@dataclass
class DevStack:
    settings: Settings
    fleet_file: Path
    say: Callable[[str], None] = print
    postgres: EmbeddedPostgres | None = None
    temporal: DevTemporal | None = None
    workers: WorkerHost | None = None
    _stops: list[Callable[[], None]] = field(default_factory=list)
    _lock: IO[str] | None = None

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
        state = self.settings.state_dir
        try:
            self.say("starting PostgreSQL ...")
            self.postgres = EmbeddedPostgres(state / "postgres").start()
            self._stops.append(self.postgres.stop)
            self.say("migrating the schema and applying the fleet ...")
            result = asyncio.run(prepare_database(self.postgres.url, self.fleet_file))
            self.say(f"fleet {self.fleet_file}: {result.summary()}")
            self.say("starting the Temporal dev server and UI ...")
            self.temporal = DevTemporal(state / "temporal", namespace=self.settings.temporal_namespace).start()
            self._stops.append(self.temporal.stop)
            worker_settings = self.settings.model_copy(
                update={"temporal_address": self.temporal.address, "temporal_namespace": self.temporal.namespace}
            )
            self.say("starting the control worker and the node agents ...")
            self.workers = WorkerHost(worker_settings, self.fleet_file)
            self.workers.start(self.postgres.url)
            self._stops.append(self.workers.stop)
            down = (
                f" (no agent for {', '.join(self.workers.skipped)}: agentDown in the fleet)"
                if self.workers.skipped
                else ""
            )
            self.say(f"{len(self.workers.agents)} node agents running{down}")
            api_url = self.workers.start_api(free_port())
            admin_token, tenant_tokens, node_tokens = asyncio.run(issue_tokens(self.postgres.url, self.workers.agents))
            self.workers.start_reporting(api_url, node_tokens)
        except BaseException:
            self.stop()
            raise
        context = StackContext(
            temporal_address=self.temporal.address,
            temporal_namespace=self.temporal.namespace,
            temporal_ui_url=self.temporal.ui_url,
            database_url=self.postgres.url,
            api_url=api_url,
            admin_token=admin_token,
            tenant_tokens=tenant_tokens,
            pid=os.getpid(),
        )
        write_context(self.settings, context)
        return context

    def stop(self) -> None:
        """Stop everything this stack started, newest first; forget the context so no command points at it."""
        while self._stops:
            self._stops.pop()()
        self.settings.context_file.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
