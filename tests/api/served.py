"""The API served over real HTTP by uvicorn, built the way production builds it (settings only: its own engine at
start-up, a lazily connected Temporal client), on a thread with its own event loop, next to a lab control worker
and node agents. For tests that drive it as an outside client would, such as schemathesis."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from api.app import create_app
from config.settings import Settings
from store.db import create_engine, session_factory
from store.tokens import create_token, ensure_tenant_tokens
from tests.workflows.lab import FAST, running_lab


@dataclass
class Served:
    base_url: str
    admin_token: str
    tenant_tokens: dict[str, str]
    control_queue: str = "berth.control"

    def admin_env(self) -> dict[str, str | None]:
        """The environment of a `berth` command run against this API as its admin, and nothing else."""
        return {"BERTH_API_URL": self.base_url, "BERTH_TOKEN": self.admin_token, "BERTH_DATABASE_URL": None}


async def _serve(
    database_url: str,
    temporal_address: str,
    namespace: str,
    fleet_text: str,
    home: Path,
    extra: dict[str, Any],
    listener: socket.socket,
    ready: asyncio.Future[Served],
    stop: threading.Event,
) -> None:
    engine = create_engine(database_url, pool_size=2)
    sessions = session_factory(engine)
    try:
        client = await Client.connect(temporal_address, namespace=namespace, data_converter=pydantic_data_converter)
        async with running_lab(client, client, sessions, home, fleet_text) as lab:
            async with sessions.begin() as session:
                admin = await create_token(session, "admin")
                tenants = await ensure_tenant_tokens(session)
            settings = Settings(
                database_url=database_url,
                temporal_address=temporal_address,
                temporal_namespace=namespace,
                control_task_queue=lab.queues.control,
                node_task_queue_prefix=lab.queues.node_prefix,
                **extra,
            )
            app = create_app(settings, timing=FAST)
            await _until_stopped(
                app, listener, ready, stop, lambda url: Served(url, admin, tenants, lab.queues.control)
            )
    finally:
        await engine.dispose()


async def _serve_alone(
    settings: Settings, listener: socket.socket, ready: asyncio.Future[Served], stop: threading.Event
) -> None:
    engine = create_engine(settings.database_url or "", pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            admin = await create_token(session, "admin", label="tests")
    finally:
        await engine.dispose()
    await _until_stopped(create_app(settings), listener, ready, stop, lambda url: Served(url, admin, {}))


async def _until_stopped(
    app: Any,
    listener: socket.socket,
    ready: asyncio.Future[Served],
    stop: threading.Event,
    served: Callable[[str], Served],
) -> None:
    """Serve `app` on `listener` until `stop` is set; `ready` gets what the test is told once it answers."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.02)
    host, port = listener.getsockname()
    ready.set_result(served(f"http://{host}:{port}"))
    await asyncio.to_thread(stop.wait)
    server.should_exit = True
    await serving


@contextlib.contextmanager
def _on_a_thread(
    serve: Callable[[socket.socket, asyncio.Future[Served], threading.Event], Coroutine[Any, Any, None]],
) -> Iterator[Served]:
    """Run `serve` on a thread with its own event loop; yield what it makes ready, stop it at the end."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    stop = threading.Event()
    loop = asyncio.new_event_loop()
    ready: asyncio.Future[Served] = loop.create_future()

    async def run() -> None:
        try:
            await serve(listener, ready, stop)
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(_wait(ready), loop).result(timeout=60)
    finally:
        stop.set()
        thread.join(timeout=60)
        loop.close()
        listener.close()


@contextlib.contextmanager
def served_api(
    database_url: str, temporal_address: str, namespace: str, fleet_text: str, home: Path, **settings: Any
) -> Iterator[Served]:
    """`settings`: more of the API's Settings (an OIDC issuer, say)."""
    with _on_a_thread(
        functools.partial(_serve, database_url, temporal_address, namespace, fleet_text, home, settings)
    ) as served:
        yield served


@contextlib.contextmanager
def served_alone(database_url: str, temporal_address: str, namespace: str) -> Iterator[Served]:
    """The API alone over real HTTP (no control worker, no node agents), on whatever the database holds, with an
    admin token: for what needs only its routes, PostgreSQL and Temporal's frontend (a fleet apply, tokens)."""
    settings = Settings(database_url=database_url, temporal_address=temporal_address, temporal_namespace=namespace)
    with _on_a_thread(functools.partial(_serve_alone, settings)) as served:
        yield served


async def _wait(ready: asyncio.Future[Served]) -> Served:
    return await ready
