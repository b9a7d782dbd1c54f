"""Every failure of a call as one exception type, `BerthError`, carrying what the API said: `code` (the API's error
code, e.g. `not_found`, `quota_exceeded`), `message`, `status` (the HTTP status; None when no answer came) and
`details` (the envelope's `details`, e.g. a 422's `[{field, message, type}]`).

The subclasses are the cases a program branches on: the status class of an answer, or no answer at all.
"""

from __future__ import annotations

from typing import Any


class BerthError(Exception):
    """A call failed. `str()` is one line: the message, the code and the status."""

    def __init__(self, message: str, *, code: str = "failed", status: int | None = None, details: Any = None) -> None:
        where = f", HTTP {status}" if status is not None else ""
        super().__init__(f"{message} ({code}{where})")
        self.message, self.code, self.status, self.details = message, code, status, details


class InvalidRequest(BerthError):
    """400 or 422: the request is wrong as sent (a bad field, an unknown region, an invalid fleet file)."""


class Unauthorized(BerthError):
    """401: no token, or one the API does not take (expired, revoked, unknown)."""


class Forbidden(BerthError):
    """403: the token is valid but its role or tenant may not do this."""


class NotFound(BerthError):
    """404: no such thing, or one the caller may not see (another tenant's allocation reads as absent)."""


class Conflict(BerthError):
    """409: valid, but not now or not this way (`invalid_state`, `quota_exceeded`, `idempotency_conflict`, ...)."""


class RateLimited(BerthError):
    """429 `rate_limited`, after the client's retries honouring Retry-After ran out."""


class Unavailable(BerthError):
    """503: a dependency of the API is down (`no_control_worker`, `temporal_unavailable`, ...), after retries."""


class OutcomeUnknown(Unavailable):
    """503 `outcome_unknown`: a change was sent to a running workflow and may still be carried out."""


class Unreachable(BerthError):
    """No answer: the API could not be connected to, or the connection broke before its answer."""


class TimedOut(BerthError):
    """A request's own timeout, or a wait's overall timeout, passed first."""


class Ended(BerthError):
    """A wait for a state saw the thing end in another one (`failed`, `cancelled`, ...); `code` is that state."""

    def __init__(self, message: str, *, code: str, details: Any = None) -> None:
        super().__init__(message, code=code, details=details)


class NotConfigured(BerthError):
    """Nothing says which API to call or which token to send."""


def invalid_request(problems: list[dict[str, Any]]) -> InvalidRequest:
    """A request body refused before it is sent, in the words and shape of the API's own 422: `invalid_request`,
    "the request is not valid: body.gpu_count: ...", `details` one `{field, message, type}` per problem (pydantic's
    `errors()`, whose locations get the API's `body.` prefix)."""
    listed = [
        {"field": _field_path(("body", *problem["loc"])), "message": problem["msg"], "type": problem["type"]}
        for problem in problems
    ]
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in listed[:3])
    more = f" (and {len(listed) - 3} more)" if len(listed) > 3 else ""
    return InvalidRequest(f"the request is not valid: {summary}{more}", code="invalid_request", details=listed)


def _field_path(loc: tuple[int | str, ...]) -> str:
    """`('body', 'labels', 0)` -> `body.labels[0]`, as the API writes a field's place."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


BY_STATUS: dict[int, type[BerthError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}


def from_answer(status: int, reason: str, body: Any) -> BerthError:
    """The exception for a non-2xx answer: the API's envelope `{"error": {code, message, details}}` when it is one,
    else (a proxy's page) the status alone, code `http_<status>`."""
    try:
        error = body["error"]
        message, code, details = " ".join(str(error["message"]).split()), str(error["code"]), error.get("details")
    except (KeyError, TypeError):
        message, code, details = f"the API answered HTTP {status} {reason}", f"http_{status}", None
    kind = OutcomeUnknown if code == "outcome_unknown" else BY_STATUS.get(status, BerthError)
    return kind(message, code=code, status=status, details=details)
