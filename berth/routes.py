"""Which route of the API each client method calls: every resource method declares its routes with `@calls`, and
`declared()` lists them all, so a test compares them with the API's OpenAPI schema and fails on a route no method
calls (tests/client/test_routes_covered.py)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Route:
    """`method` and `path` as the OpenAPI schema writes them (`/v1/allocations/{allocation_id}`). `idempotent`:
    sending it twice does what sending it once does, so a lost answer may be retried (GET, PUT and DELETE are; a
    POST only when the API documents it)."""

    method: str
    path: str
    idempotent: bool | None = None

    @property
    def safe_to_repeat(self) -> bool:
        return self.idempotent if self.idempotent is not None else self.method in ("GET", "PUT", "DELETE", "HEAD")

    def format(self, **values: str) -> str:
        """The path with its parameters, each one path segment whatever it holds (an id with a `/` cannot reach
        another route)."""
        return self.path.format(**{key: quote(str(value), safe="") for key, value in values.items()})


def calls(*routes: Route) -> Callable[[F], F]:
    def mark(method: F) -> F:
        method.__berth_routes__ = routes  # type: ignore[attr-defined]
        return method

    return mark


def routes_of(cls: type) -> Iterable[tuple[str, Route]]:
    for name, member in inspect.getmembers(cls):
        for route in getattr(member, "__berth_routes__", ()):
            yield f"{cls.__name__}.{name}", route


def declared() -> dict[tuple[str, str], list[str]]:
    """(method, path) -> the client methods that call it, over every resource of `berth.AsyncClient`."""
    from berth.resources import RESOURCES

    found: dict[tuple[str, str], list[str]] = {}
    for cls in RESOURCES:
        for where, route in routes_of(cls):
            found.setdefault((route.method, route.path), []).append(where)
    return found
