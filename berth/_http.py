"""One request with its retries and its error, written once as a coroutine over a small transport protocol.

`AsyncIO` awaits httpx's async client and asyncio's sleep; `Blocking` runs httpx's sync client and `time.sleep`
inside coroutines that never suspend, so `drive()` completes them on their first `send(None)`. The resources
(berth/resources.py) are written against `Http` alone and so serve both clients.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx

from berth import errors

T = TypeVar("T")

# 503 and 429 codes the API documents as "nothing was done": safe to send again whatever the call.
NOTHING_DONE = frozenset(
    {
        "rate_limited",
        "no_control_worker",
        "temporal_unavailable",
        "database_unavailable",
        "identity_provider_unavailable",
    }
)


def drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (every await reaches a `Blocking` transport) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a sync berth.Client call suspended: an async transport was given to the sync client")


class Transport(Protocol):
    async def send(self, request: httpx.Request) -> httpx.Response: ...

    async def sleep(self, seconds: float) -> None: ...

    async def close(self) -> None: ...


class AsyncIO:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, request: httpx.Request) -> httpx.Response:
        return await self.client.send(request)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def close(self) -> None:
        await self.client.aclose()


class Blocking:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    async def send(self, request: httpx.Request) -> httpx.Response:
        return self.client.send(request)

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - the sync client's coroutines never suspend, by design

    async def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class Retries:
    """How a call is sent again: at most `attempts` sends in all, within `total` seconds from the first; the wait
    before each is the answer's Retry-After when it gives one, else `backoff` doubling up to `max_backoff`."""

    attempts: int = 5
    total: float = 60.0
    backoff: float = 0.5
    max_backoff: float = 10.0


@dataclass(frozen=True)
class Timeouts:
    """Per request: `connect` to open the connection, `read` for the answer (the API's own Temporal calls answer
    within about 30 s, so its 503 arrives before ours)."""

    connect: float = 10.0
    read: float = 35.0

    def httpx(self, read: float | None = None) -> httpx.Timeout:
        return httpx.Timeout(read if read is not None else self.read, connect=self.connect)


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None  # `nan` or `inf`: no usable delay
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


class Http:
    """The API at `url` with a bearer: `call` sends one request, retries what is safe to retry, and returns the
    answer or raises a `BerthError`."""

    def __init__(self, url: str, token: str | None, transport: Transport, retries: Retries, timeouts: Timeouts) -> None:
        """`token` None: no bearer at all, for the routes that need none (`GET /v1/auth`, `/healthz`)."""
        self.url, self.transport, self.retries, self.timeouts = url.rstrip("/"), transport, retries, timeouts
        self._headers = {"User-Agent": "berth-python"} | ({"Authorization": f"Bearer {token}"} if token else {})

    async def call(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: str | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> httpx.Response:
        """`idempotent`: sending it twice does what sending it once does (a GET, a keyed create, a release), so a
        lost answer or `outcome_unknown` may be retried; otherwise only answers that say nothing was done are."""
        query = {key: value for key, value in (params or {}).items() if value is not None}
        request_headers = {**self._headers, **(headers or {})}
        started = time.monotonic()
        delay = self.retries.backoff
        attempt = 0
        while True:
            attempt += 1
            request = httpx.Request(
                method,
                self.url + path,
                params=query,
                json=json,
                content=content,
                headers=request_headers,
                extensions={"timeout": self.timeouts.httpx(read_timeout).as_dict()},
            )
            wait: float | None
            try:
                response = await self.transport.send(request)
            except httpx.TransportError as error:
                failure = _transport_failure(error, self.url, method, path)
                never_sent = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout)
                wait = delay if (never_sent or idempotent) else None
            else:
                if not response.is_error:
                    return response
                failure = errors.from_answer(response.status_code, response.reason_phrase, _json(response))
                wait = None
                if response.status_code in (429, 503):
                    if failure.code in NOTHING_DONE or idempotent:
                        wait = retry_after(response)
                        wait = delay if wait is None else wait
            if wait is None or attempt >= self.retries.attempts:
                raise failure
            if time.monotonic() - started + wait > self.retries.total:
                raise failure
            await self.transport.sleep(wait)
            delay = min(delay * 2, self.retries.max_backoff)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _transport_failure(error: httpx.TransportError, url: str, method: str, path: str) -> errors.BerthError:
    if isinstance(error, httpx.TimeoutException):
        return errors.TimedOut(
            f"the Berth API at {url} did not answer {method} {path} in time ({type(error).__name__})", code="timed_out"
        )
    return errors.Unreachable(
        f"cannot reach the Berth API at {url}: {error or type(error).__name__}", code="unreachable"
    )
