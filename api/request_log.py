"""Every mutating API request, recorded with who made it (`api_requests`): the audit of actions that are not an
allocation's own steps (a cordon, a drain, a repair, a fleet apply, a ModelDeployment), and of refusals too.

Recorded after the answer is sent, so it costs the caller nothing; a record that cannot be written (PostgreSQL is
down) is logged and dropped, never turned into an error for a request already answered. A node agent's steady
reports are not actions and are left out: ten thousand agents report every minute. Read with
`GET /v1/audit/requests` (operators) or `berth audit requests`.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import PRINCIPAL
from api.services import Services
from store import requests
from store.tokens import Principal

log = logging.getLogger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READS = frozenset({"/v1/explain"})  # a POST that changes nothing: a dry run of placement


class RequestLog:
    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING:
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            await self._record(scope, status)

    async def _record(self, scope: Scope, status: int) -> None:
        caller = scope.get("state", {}).get(PRINCIPAL)
        route = getattr(scope.get("route"), "path", None)
        if not isinstance(caller, Principal) or caller.role == "node" or route is None or route in READS:
            return  # an unauthenticated request is no one's action (401s are counted by the request metrics)
        try:
            async with self.services.sessions.begin() as session:
                await requests.record(
                    session,
                    actor=caller.actor,
                    role=caller.role,
                    method=scope["method"],
                    route=route,
                    path=scope["path"],
                    status=status,
                )
        except Exception as error:  # the answer is sent; a lost record is logged, never an error
            log.warning("could not record %s %s by %s: %s", scope["method"], scope["path"], caller.actor, error)
