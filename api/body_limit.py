"""Request bodies bounded before they are read, and their senders authenticated before they are parsed.

Without this, FastAPI reads and parses a whole body before any dependency runs, so a 100 MB `POST
/v1/allocations` without a token was read into memory and parsed before its 401 (eight in parallel took the API from
160 MB to 1.05 GB). This pure ASGI middleware sits outside routing, where the body is still unread:

- a `Content-Length` above the route's limit is answered 413 `payload_too_large` at once, without reading a byte;
- a body sent without one (chunked) is counted as it arrives, and refused 413 the moment it passes the limit, so no
  more than the limit (plus one chunk) is ever held;
- a request to a `/v1/` route that carries a body must first show a valid bearer token: 401 before the body is read
  at all. The principal found is kept in the request's state, so the route's own auth (api/auth.py) does not look
  the token up twice.

Limits are per route kind (`config/settings.py`): a fleet file or a deployment manifest is legitimately larger than
an allocation request, and a node report carries a host inventory of up to `MAX_HOST_BYTES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastapi.security.utils import get_authorization_scheme_param
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import PRINCIPAL, verified
from api.errors import ApiError, database_unavailable, error_response
from api.services import Services
from config.settings import Settings
from store.outage import is_database_outage

_REPORT = re.compile(r"^/v1/nodes/[^/]+/report$")
_MANIFESTS = re.compile(r"^/v1/(fleet|deployments/[^/]+|namespaces/[^/]+/deployments/[^/]+)$")


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes its limit. An HTTPException, so FastAPI's body reading
    passes it on as it is (anything else it turns into a 400) and the app's handler answers it in the envelope."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large(limit).message)
        self.details = too_large(limit).details


def too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        "payload_too_large",
        f"the request body is larger than this route's limit of {limit} bytes",
        {"limit_bytes": limit},
    )


@dataclass(frozen=True)
class BodyLimits:
    default: int
    manifest: int  # PUT /v1/fleet and the deployment PUTs
    report: int  # POST /v1/nodes/{node}/report

    @classmethod
    def from_settings(cls, settings: Settings) -> BodyLimits:
        return cls(settings.api_max_body_bytes, settings.api_max_manifest_bytes, settings.api_max_report_bytes)

    def for_request(self, method: str, path: str) -> int:
        if method == "PUT" and _MANIFESTS.match(path):
            return self.manifest
        if method == "POST" and _REPORT.match(path):
            return self.report
        return self.default


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class BodyLimit:
    def __init__(self, app: ASGIApp, services: Services, limits: BodyLimits) -> None:
        self.app = app
        self.services = services
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.for_request(scope["method"], scope["path"])
        length = _header(scope, b"content-length")
        declared = int(length) if length is not None and length.strip().isdigit() else None
        if declared is not None and declared > limit:
            await error_response(too_large(limit))(scope, receive, send)
            return
        carries_body = bool(declared) or _header(scope, b"transfer-encoding") is not None
        if carries_body and scope["path"].startswith("/v1/"):
            refusal = await self._authenticate(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self._counted(scope, receive, send, limit)

    async def _authenticate(self, scope: Scope) -> ApiError | None:
        """The route's own token check, done before the body is touched; the principal is kept for the route."""
        scheme, token = get_authorization_scheme_param(_header(scope, b"authorization"))
        try:
            found = await verified(token if scheme.lower() == "bearer" and token else None, self.services)
        except ApiError as refusal:
            return refusal
        except Exception as error:  # outside the app's exception handlers: an outage is told here, as they tell it
            if not is_database_outage(error):
                raise
            return database_unavailable(error)
        scope.setdefault("state", {})[PRINCIPAL] = found
        return None

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        received = 0
        started = False

        async def counting() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting, tracking)
        except BodyTooLarge:  # raised where no exception handler answers it (api/steady_reports.py reads early)
            if started:
                raise
            await error_response(too_large(limit))(scope, receive, send)
