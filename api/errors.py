"""The one error shape of the API: `{"error": {"code", "message", "details"}}`, for every 4xx and 5xx.

Routes raise `ApiError` with a stable code a client can branch on; request validation failures, unknown routes and
wrong methods are translated into the same envelope, so a client never has to parse two error formats. A 500 means
a bug in Berth: it is logged with its traceback and the caller gets the envelope, never a stack trace.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from fleet.loader import field_path
from store.outage import DATABASE_ERRORS, is_database_outage

log = logging.getLogger("berth.api")


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorEnvelope(BaseModel):
    error: ErrorBody


class ApiError(Exception):
    """An answer other than success, with the status, code and message the client sees."""

    def __init__(
        self, status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def not_found(what: str, name: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} {name!r} does not exist", {"kind": what, "name": name})


def conflict(message: str, details: Any = None) -> ApiError:
    return ApiError(409, "invalid_state", message, details)


def unavailable(code: str, message: str) -> ApiError:
    return ApiError(503, code, message, headers={"Retry-After": "5"})


_DESCRIPTIONS = {
    400: "The request is understood but cannot be acted on (for example an invalid fleet file).",
    401: "No bearer, or one that is unknown, revoked, expired or not a good ID token of the configured issuer.",
    403: "The caller's role may not do this (a route above its role, a tenant it only views, a node token).",
    404: "No such object, or it belongs to another tenant.",
    409: "The object is in a state that does not allow this, or an Idempotency-Key was reused with another body.",
    413: "The body is larger than this route's limit (`details.limit_bytes`); nothing of it was read past the limit.",
    422: "The request does not match the schema; `details` lists each field path and what is wrong with it.",
    503: "Temporal, PostgreSQL or the identity provider is unreachable, or no control worker runs; nothing was "
    "changed. Retry later. Except `outcome_unknown`: the action was sent and may still be carried out.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of the error answers a route can give, all in the one envelope."""
    return {status: {"model": ErrorEnvelope, "description": _DESCRIPTIONS[status]} for status in statuses}


def openapi_error(status: int) -> dict[str, Any]:
    """The same documentation as `error_responses`, written straight into a built OpenAPI document."""
    schema = {"$ref": "#/components/schemas/ErrorEnvelope"}
    return {"description": _DESCRIPTIONS[status], "content": {"application/json": {"schema": schema}}}


def _envelope(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorEnvelope(error=ErrorBody(code=code, message=message, details=details))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def error_response(error: ApiError) -> JSONResponse:
    return _envelope(error.status, error.code, error.message, error.details, error.headers)


async def _api_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(error)


async def _validation_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    problems = [
        {"field": field_path(item["loc"]), "message": item["msg"], "type": item["type"]} for item in error.errors()
    ]
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return _envelope(422, "invalid_request", f"the request is not valid: {summary}{more}", problems)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def allowed_methods(request: Request) -> str | None:
    """Every method the request's path takes, as the published schema documents them, for a 405's `Allow`.
    Starlette names only the methods of the first route whose path matched, and each method of a path is a route
    of its own here (so `OPTIONS /v1/allocations` answered `Allow: POST` while the path also takes GET). None for
    a path the schema does not document (the docs' own routes), whose `Allow` Starlette already gives."""
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        if _template_pattern(template).match(request.url.path):
            methods |= {method.upper() for method in operations if method.upper() in _METHODS}
    return ", ".join(sorted(methods)) or None


_METHODS = frozenset({"GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE"})


@functools.cache
def _template_pattern(template: str) -> re.Pattern[str]:
    """`/v1/allocations/{allocation_id}` -> a pattern matching `/v1/allocations/<one segment>`."""
    parts = re.split(r"(\{[^/{}]+\})", template)
    return re.compile("^" + "".join("[^/]+" if part.startswith("{") else re.escape(part) for part in parts) + "$")


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    """Errors raised by the framework itself: an unknown path, a method the path does not take, a body that cannot
    be decoded at all (answered like any other invalid request)."""
    assert isinstance(error, HTTPException)
    if error.status_code == 400:
        return _envelope(
            422,
            "invalid_request",
            f"the request is not valid: {error.detail}",
            [{"field": "body", "message": str(error.detail), "type": "unparsable"}],
        )
    code = _HTTP_CODES.get(error.status_code, "http_error")
    headers = dict(error.headers or {})
    allowed = allowed_methods(request) if error.status_code == 405 else None
    if allowed is not None:
        headers["Allow"] = allowed
    details = getattr(error, "details", None)  # api/body_limit.py's BodyTooLarge names its limit
    return _envelope(error.status_code, code, str(error.detail), details, headers or None)


def database_unavailable(error: BaseException) -> ApiError:
    """The 503 for a PostgreSQL outage, naming what the driver said (never a statement or a parameter)."""
    reason = type(getattr(error, "orig", None) or error).__name__
    message = f"PostgreSQL is unavailable ({reason}); nothing was changed. Retry later."
    return unavailable("database_unavailable", message)


async def _database_error(request: Request, error: Exception) -> JSONResponse:
    """A database error is an outage (503, the client retries) or a bug in Berth (500, logged)."""
    if not is_database_outage(error):
        return await _bug(request, error)
    log.warning("PostgreSQL unavailable during %s %s: %s", request.method, request.url.path, error)
    return await _api_error(request, database_unavailable(error))


async def _bug(request: Request, error: Exception) -> JSONResponse:
    log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=error)
    return _envelope(500, "internal_error", "Berth hit an internal error; it has been logged")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    for database in DATABASE_ERRORS:
        app.add_exception_handler(database, _database_error)
    app.add_exception_handler(Exception, _bug)
