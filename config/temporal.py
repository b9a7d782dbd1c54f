"""One way to reach Temporal: the address, namespace and TLS from settings, and the pydantic data converter that
every client and worker of Berth must share. The control plane connects to Temporal itself; a node agent only ever
to the node gateway (gateway/), with its node token."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from config import tracing
from config.context import temporal_target
from config.settings import Settings


def _tls(settings: Settings) -> TLSConfig | bool:
    if not settings.temporal_tls:
        return False
    return TLSConfig(
        server_root_ca_cert=settings.temporal_tls_ca.read_bytes() if settings.temporal_tls_ca else None,
        client_cert=settings.temporal_tls_cert.read_bytes() if settings.temporal_tls_cert else None,
        client_private_key=settings.temporal_tls_key.read_bytes() if settings.temporal_tls_key else None,
    )


async def connect(settings: Settings, *, patiently: bool = False) -> Client:
    """The control plane's client. `patiently`: a Temporal that does not answer yet is waited for, saying so, as a
    long-running process should (a control worker that starts before the server, or while it restarts), instead of
    ending at once; a CLI command fails at once."""
    address, namespace = temporal_target(settings)
    credentials = settings.temporal_credentials

    async def attempt() -> Client:
        return await Client.connect(
            address,
            namespace=namespace,
            data_converter=pydantic_data_converter,
            tls=_tls(settings),
            interceptors=tracing.interceptors(),
            api_key=await credentials.token() if credentials else None,
        )

    client = await _keep_trying(attempt, f"Temporal at {address}") if patiently else await attempt()
    if credentials is not None:  # its token renewed for as long as the process runs
        renewal = asyncio.get_running_loop().create_task(credentials.keep_fresh(lambda token: _set_key(client, token)))
        _RENEWALS.add(renewal)
        renewal.add_done_callback(_RENEWALS.discard)
    return client


_RENEWALS: set[asyncio.Task[None]] = set()  # the renewal tasks, held so that they are not collected


def _set_key(client: Client, token: str) -> None:
    client.api_key = token


log = logging.getLogger("berth.temporal")
# How the gateway's refusals read in the SDK's connection error: these will not pass by waiting.
REFUSALS = ("Unauthenticated", "PermissionDenied", "unknown or revoked")


class NoGateway(ValueError):
    pass


async def connect_node(settings: Settings, token: str) -> Client:
    """A node agent's connection: to the node gateway, its node token as the bearer credential; TLS when the
    gateway's CA is given (always across a network: the token travels in every call). A gateway not up yet (an
    agent may start before it, as on a host that boots first) is waited for; a refusal ends it."""
    if not settings.node_gateway:
        raise NoGateway(
            "a node agent reaches Temporal only through the node gateway: set BERTH_NODE_GATEWAY to the host:port "
            "of `berth gateway`"
        )
    tls: TLSConfig | bool = False
    if settings.node_gateway_ca is not None:
        tls = TLSConfig(server_root_ca_cert=settings.node_gateway_ca.read_bytes())

    async def attempt() -> Client:
        return await Client.connect(
            settings.node_gateway,
            namespace=settings.temporal_namespace,
            data_converter=pydantic_data_converter,
            api_key=token,
            tls=tls,
            interceptors=tracing.interceptors(),
        )

    try:
        return await _keep_trying(attempt, f"the node gateway at {settings.node_gateway}", REFUSALS)
    except Refused as error:
        raise RuntimeError(f"the node gateway refused this node: {error}") from None


class Refused(RuntimeError):
    """The server answered no: waiting will not change it."""


async def _keep_trying(attempt: Callable[[], Awaitable[Client]], what: str, refusals: tuple[str, ...] = ()) -> Client:
    """`attempt` until it connects, waiting a little longer each time (up to 5 s) and saying why it waits."""
    delay = 0.2
    while True:
        try:
            return await attempt()
        except RuntimeError as error:
            if any(word in str(error) for word in refusals):
                raise Refused(str(error)) from None
            log.warning("%s does not answer yet (%s); trying again", what, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
