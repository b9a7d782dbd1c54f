"""Berth's Python client: `berth.Client` (blocking) and `berth.AsyncClient`, the same methods, typed with the wire
models of contracts/http.py. See berth/README.md and docs/client.md."""

from berth._http import Retries, Timeouts
from berth.client import AsyncClient, Client, allocate, auth_config
from berth.errors import (
    BerthError,
    Conflict,
    Ended,
    Forbidden,
    InvalidRequest,
    NotConfigured,
    NotFound,
    OutcomeUnknown,
    RateLimited,
    TimedOut,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from berth.resources import Allocation
from berth.target import Target, resolve_target

__all__ = [
    "Allocation",
    "AsyncClient",
    "BerthError",
    "Client",
    "Conflict",
    "Ended",
    "Forbidden",
    "InvalidRequest",
    "NotConfigured",
    "NotFound",
    "OutcomeUnknown",
    "RateLimited",
    "Retries",
    "Target",
    "TimedOut",
    "Timeouts",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "allocate",
    "auth_config",
    "resolve_target",
]
