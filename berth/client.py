"""`AsyncClient` and `Client`: the resources of berth/resources.py over one HTTP connection pool, the target
resolved as the CLI resolves it (berth/target.py), and `allocate`, a context manager that gives back what it took.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any

import httpx

from berth import errors
from berth._http import AsyncIO, Blocking, Http, Retries, Timeouts, Transport, drive
from berth._sync import synced
from berth.resources import (
    Allocation,
    Allocations,
    Audit,
    Capacity,
    Deployments,
    Fleet,
    Nodes,
    Queues,
    Reservations,
    Root,
    Tokens,
)
from berth.target import resolve_target, resolve_url
from contracts.allocation import HOLDING_STATES
from contracts.http import AllocationCreate, AuthConfig

log = logging.getLogger("berth")
DEFAULT_RETRIES, DEFAULT_TIMEOUTS = Retries(), Timeouts()

SUBRESOURCES = {
    "allocations": Allocations,
    "reservations": Reservations,
    "queues": Queues,
    "capacity": Capacity,
    "nodes": Nodes,
    "fleet": Fleet,
    "deployments": Deployments,
    "audit": Audit,
    "tokens": Tokens,
}


class AsyncClient(Root):
    """Berth's API, async. `api` and `token` default to BERTH_API_URL and BERTH_TOKEN, then the login `berth
    login` kept for that API, then the context file `berth up` wrote (`tenant`: that tenant's token from it).
    `transport`: an httpx transport to send through (a proxy's, or a test's)."""

    allocations: Allocations
    reservations: Reservations
    queues: Queues
    capacity: Capacity
    nodes: Nodes
    fleet: Fleet
    deployments: Deployments
    audit: Audit
    tokens: Tokens

    def __init__(
        self,
        api: str | None = None,
        token: str | None = None,
        *,
        tenant: str | None = None,
        retries: Retries = DEFAULT_RETRIES,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        transport: httpx.AsyncBaseTransport | None = None,
        _io: Transport | None = None,
    ) -> None:
        target = resolve_target(api, token, tenant, environment=True)
        self.url = target.url
        io = _io or AsyncIO(httpx.AsyncClient(transport=transport))
        http = Http(target.url, target.token, io, retries, timeouts)
        super().__init__(http)
        for name, resource in SUBRESOURCES.items():
            setattr(self, name, resource(http))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    async def aclose(self) -> None:
        await self._http.transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @asynccontextmanager
    async def allocate(
        self,
        request: AllocationCreate | None = None,
        *,
        timeout: float = 600.0,  # noqa: ASYNC109 - the wait for active, under both drivers
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> AsyncIterator[Allocation]:
        """Create an allocation, wait until it is active (at most `timeout` seconds) and give it back when the
        block ends, however it ends: released once active, cancelled before. Inside, `.address` is the VM's IP."""
        key = idempotency_key or f"berth-py-{uuid.uuid4().hex}"
        try:
            accepted = await self.allocations.create(request, idempotency_key=key, **fields)
        except BaseException as failure:
            # An answer (or a body refused before sending) says nothing was made; no answer, or an interruption,
            # does not.
            answered = isinstance(failure, errors.BerthError) and (
                failure.status is not None or isinstance(failure, errors.InvalidRequest)
            )
            if not answered or isinstance(failure, errors.OutcomeUnknown):  # it may have been carried out
                await self._take_back(key, request, fields)
            raise
        try:
            allocation = await self.allocations.wait(accepted.id, "active", timeout=timeout)
            yield allocation
        except BaseException:
            try:
                await self._give_back(accepted.id)
            except errors.BerthError as failure:  # the block's own exception is the one to see
                log.warning("could not give back allocation %s: %s", accepted.id, failure)
            raise
        await self._give_back(accepted.id)

    async def _take_back(self, key: str, request: AllocationCreate | None, fields: dict[str, Any]) -> None:
        """After a create that did not answer: the same create again, with its key, names the allocation if it was
        made (and makes it if not), which is then given back, so no allocation outlives the block that asked."""
        try:
            made = await self.allocations.create(request, idempotency_key=key, **fields)
            await self._give_back(made.id)
        except errors.BerthError as failure:
            log.warning("an interrupted allocate() could not make sure nothing was left: %s", failure)

    async def _give_back(self, allocation_id: str) -> None:
        """Release it when it holds GPUs, else cancel it; one already ended needs nothing."""
        state = (await self.allocations.get(allocation_id)).state
        try:
            if state in HOLDING_STATES:
                await self.allocations.release(allocation_id)
            else:
                await self.allocations.cancel(allocation_id)
        except errors.Conflict:
            if (await self.allocations.get(allocation_id)).state in HOLDING_STATES:
                await self.allocations.release(allocation_id)


_SyncRoot = synced(AsyncClient)


class Client(_SyncRoot):  # type: ignore[misc,valid-type]
    """Berth's API, blocking: the same methods as `AsyncClient`, each run to its end. `with Client() as berth:`
    closes its connections at the end. `transport`: an httpx (sync) transport to send through."""

    def __init__(
        self,
        api: str | None = None,
        token: str | None = None,
        *,
        tenant: str | None = None,
        retries: Retries = DEFAULT_RETRIES,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        blocking = Blocking(httpx.Client(transport=transport))
        wrapped = AsyncClient(api, token, tenant=tenant, retries=retries, timeouts=timeouts, _io=blocking)
        super().__init__(wrapped)
        self.url = wrapped.url
        for name, resource in SUBRESOURCES.items():
            setattr(self, name, SYNC[resource](getattr(wrapped, name)))

    def __repr__(self) -> str:
        return f"<Client {self.url}>"

    def close(self) -> None:
        drive(self._async.aclose())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


SYNC: dict[type, type] = {resource: synced(resource) for resource in SUBRESOURCES.values()}


@contextmanager
def allocate(
    request: AllocationCreate | None = None,
    *,
    api: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
    timeout: float = 600.0,
    **fields: Any,
) -> Iterator[Allocation]:
    """`with berth.allocate(gpus=8, product="H200", duration="4h") as alloc:` with a client of its own (the target
    resolved as `Client()` resolves it): active inside the block, given back after it, however it ends."""
    with Client(api, token, tenant=tenant) as client, client.allocate(request, timeout=timeout, **fields) as alloc:
        yield alloc


def auth_config(api: str | None = None, *, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> AuthConfig:
    """Where people log in to the API at `api` (else BERTH_API_URL or the context file's): `GET /v1/auth`, the one
    call that needs no token, so it is what `berth login` asks first."""
    url = resolve_url(api, environment=True)
    root = synced(Root)(Root(Http(url, None, Blocking(httpx.Client()), DEFAULT_RETRIES, timeouts)))
    try:
        return root.auth_config()
    finally:
        drive(root._async._http.transport.close())
