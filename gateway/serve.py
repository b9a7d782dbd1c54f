"""`berth gateway`: the node gateway as a process, and the pieces tests and the dev stack start in-process.

The gateway is part of the control plane (it reads PostgreSQL's tokens and holds the control plane's Temporal
credentials); it is the one control-plane address GPU hosts are given, besides the API's.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from config.context import database_url, temporal_target
from config.settings import Settings
from config.temporal_credentials import ClientCredentials
from gateway.seal import TaskTokenSeal
from gateway.server import GatewayPolicy, NodeGateway
from store.db import AsyncSession, async_sessionmaker, create_engine, session_factory

log = logging.getLogger("berth.gateway")

# Temporal's frontend takes up to 4 MiB per message by default: so do the gateway's answers to agents (a task's
# input) and its channel to Temporal. What an agent sends (a task's result or failure, a heartbeat) is a few KiB;
# the gateway takes at most 1 MiB of it, so that a compromised host cannot fill workflow histories.
MAX_MESSAGE = 4 * 1024 * 1024
MAX_FROM_AGENT = 1024 * 1024
OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
SERVER_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_FROM_AGENT)]


@dataclass
class RunningGateway:
    server: grpc.aio.Server
    port: int
    # Revocations swept every second (NodeGateway.keep_swept); the Temporal token renewed, when there is one.
    background: list[asyncio.Task[None]]

    async def stop(self, grace: float | None) -> None:
        """Stop serving: answers in flight get `grace` seconds; open polls end and their agents poll again."""
        for task in self.background:
            task.cancel()
        await self.server.stop(grace)


def upstream_channel(address: str, settings: Settings) -> grpc.aio.Channel:
    """The gateway's own connection to Temporal, with the control plane's TLS settings (BERTH_TEMPORAL_TLS_*)."""
    if not settings.temporal_tls:
        return grpc.aio.insecure_channel(address, options=OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=settings.temporal_tls_ca.read_bytes() if settings.temporal_tls_ca else None,
        private_key=settings.temporal_tls_key.read_bytes() if settings.temporal_tls_key else None,
        certificate_chain=settings.temporal_tls_cert.read_bytes() if settings.temporal_tls_cert else None,
    )
    return grpc.aio.secure_channel(address, credentials, options=OPTIONS)


def read_key(path: Path | None) -> bytes:
    """The sealing key: the file's bytes (shared by every replica, kept across restarts); a fresh random key when no
    file is given (a single gateway whose restarts may cost in-flight tasks a retry)."""
    if path is None:
        return secrets.token_bytes(32)
    key = path.read_bytes().strip()
    if len(key) < 32:
        raise ValueError(f"{path} must hold at least 32 bytes of key (e.g. `head -c 48 /dev/urandom | base64`)")
    return key


async def start_gateway(
    listen: str,
    upstream: grpc.aio.Channel,
    sessions: async_sessionmaker[AsyncSession],
    key: bytes,
    policy: GatewayPolicy,
    tls: tuple[bytes, bytes] | None = None,
    credentials: ClientCredentials | None = None,
) -> RunningGateway:
    """A started gateway (`listen` may end in `:0` for a free port); `tls` is the gateway's (private key,
    certificate chain) for serving agents over TLS; `credentials`, the control plane's token source for a Temporal
    that checks identities."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    gateway = NodeGateway(upstream, sessions, TaskTokenSeal(key), policy)
    tasks = [asyncio.create_task(gateway.keep_swept())]
    if credentials is not None:
        gateway.bearer = await credentials.token()
        tasks.append(asyncio.create_task(credentials.keep_fresh(lambda token: setattr(gateway, "bearer", token))))
    server.add_generic_rpc_handlers([gateway])
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, grpc.ssl_server_credentials([tls]))
    if port == 0:
        raise OSError(f"the node gateway cannot listen on {listen}")
    await server.start()
    return RunningGateway(server, port, tasks)


async def run_gateway(settings: Settings, ready: Callable[[], None] | None = None) -> None:
    """Serve node agents until SIGINT or SIGTERM: tokens from PostgreSQL, Temporal at the control plane's address."""
    address, namespace = temporal_target(settings)
    key = read_key(settings.gateway_key_file)
    tls = None
    if settings.gateway_tls_cert is not None or settings.gateway_tls_key is not None:
        if settings.gateway_tls_cert is None or settings.gateway_tls_key is None:
            raise ValueError("give both BERTH_GATEWAY_TLS_CERT and BERTH_GATEWAY_TLS_KEY, or neither")
        tls = (settings.gateway_tls_key.read_bytes(), settings.gateway_tls_cert.read_bytes())
    engine = create_engine(database_url(settings))
    upstream = upstream_channel(address, settings)
    policy = GatewayPolicy(namespace=namespace, queue_prefix=settings.node_task_queue_prefix)
    try:
        gateway = await start_gateway(
            settings.gateway_listen, upstream, session_factory(engine), key, policy, tls, settings.temporal_credentials
        )
        log.info("node gateway serving on port %d for namespace %s", gateway.port, namespace)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        if ready is not None:
            ready()
        await stop.wait()
        await gateway.stop(grace=5)
    finally:
        await upstream.close()
        await engine.dispose()
