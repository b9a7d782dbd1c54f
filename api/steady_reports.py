"""Agents' steady reports answered before FastAPI's routing: the one request every node agent makes every interval.

A heartbeat from an agent whose host and approval this process has confirmed, made with a node token this process has
verified (the token cache of `store/token_cache.py`, whose revocation sweep is fresh), for that token's own node, is answered here: the beat is buffered
(`api/heartbeats.py`) and the same JSON as the route's steady answer goes back. Routing, dependency resolution and
response-model serialisation cost several times the work itself at 10,000 agents (docs/benchmarks.md). Anything
else (no cached token, another node, a new host, a body that does not validate) goes on to the real route with its
body intact, which answers, refuses and logs as documented.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from types import SimpleNamespace

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.services import Services
from scheduler.host.report import NodeReport, ReportReply

REPORT = re.compile(r"^/v1/nodes/([a-z0-9][a-z0-9.\-]{0,251}[a-z0-9]|[a-z0-9])/report$")
ROUTE = SimpleNamespace(path="/v1/nodes/{node}/report")  # how RequestCounter labels it, as if routed
MAX_BODY = 64 * 1024  # a heartbeat is a few hundred bytes; anything larger is a full report for the route


class SteadyReports:
    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = REPORT.match(scope.get("path", "")) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        body, complete = await _read(receive)
        if complete and await self._answer(match.group(1), scope, body, send):
            return
        await self.app(scope, _replay(body, receive, complete), send)

    async def _answer(self, node: str, scope: Scope, body: bytes, send: Send) -> bool:
        token = _bearer(scope)
        cached = self.services.tokens.cached(token) if token else None
        if cached is None or cached.node != node:
            return False
        try:
            report = NodeReport.model_validate_json(body)
        except ValidationError:
            return False
        heartbeats = self.services.heartbeats
        if not heartbeats.steady(node, report):
            return False
        heartbeats.add(node, datetime.now(UTC), report.agent.interval_seconds)
        await heartbeats.maybe_flush(self.services.sessions)
        answer = ReportReply(node=node, live=True, approved=report.approved or "").model_dump_json(exclude_none=True)
        scope["route"] = ROUTE
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer.encode()})
        return True


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None
    return None


async def _read(receive: Receive) -> tuple[bytes, bool]:
    """The body, up to MAX_BODY; (what was read, whether that is all of it)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body", False):
            return b"".join(chunks), True
        if size > MAX_BODY:
            return b"".join(chunks), False


def _replay(body: bytes, receive: Receive, complete: bool) -> Receive:
    """What the real route reads: the body already taken, then whatever is still to come."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replayed
