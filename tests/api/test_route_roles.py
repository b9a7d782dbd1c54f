"""Who may call what: the table of every route against every role, built from the app's own routes.

Each route declares the least role it needs (api/auth.py: `Viewer`, `Member`, `Operator`, `Admin`, `Reporter` for
a node agent's report) or is one of the few public ones. A route added without a decision fails here before anything
is called. Then each route is called by a caller of each role, with placeholder ids and an empty JSON body: below
its role the answer is 403 (or 401 without a token), at or above it anything but 401 and 403 (a 404 for the
placeholder id, a 422 for the empty body: the role let it through).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.routing import APIRoute

from api.app import create_app
from config.settings import Settings
from store.tokens import at_least, create_token
from tests.api.stack import Stack, bearer

PUBLIC = {("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/v1/auth")}
CALLERS = ("nobody", "viewer", "member", "operator", "admin", "node")
PLACEHOLDERS = {"node": "small", "namespace": "lab"}  # a node token reports for its own node, `small`


def _declared(route: APIRoute) -> str | None:
    """The role a route's dependencies require, found anywhere in its dependency tree."""
    pending = list(route.dependant.dependencies)
    while pending:
        dependency = pending.pop()
        role = getattr(dependency.call, "role", None)
        if role is not None:
            return role
        pending += dependency.dependencies
    return None


def api_routes(routes: list[Any], prefix: str = "") -> list[tuple[str, APIRoute]]:
    """Every API route with its full path, through the routers the app includes (FastAPI keeps each included router
    as one entry of `app.routes`, with the prefix it was included under)."""
    found: list[tuple[str, APIRoute]] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append((prefix + route.path, route))
        elif hasattr(route, "original_router"):
            found += api_routes(route.original_router.routes, prefix + route.include_context.prefix)
    return found


def table() -> dict[tuple[str, str], str]:
    """(method, path) -> the role it needs, or `public`; every route of the app, or an AssertionError naming the
    routes that decide nothing."""
    app = create_app(Settings(database_url="postgresql+asyncpg://unused/unused"))
    found: dict[tuple[str, str], str] = {}
    undecided = []
    for path, route in api_routes(app.routes):  # the OpenAPI document and its pages are not API routes: public
        if path.startswith("/console/"):  # the console's pages decide nothing: each asks the API as its visitor
            continue
        for method in sorted(route.methods):
            key = (method, path)
            role = _declared(route)
            if role is None and key not in PUBLIC:
                undecided.append(key)
            found[key] = role or "public"
    assert not undecided, f"routes with no role decision (api/auth.py) and not public: {undecided}"
    return found


def allowed(caller: str, needed: str) -> bool:
    if needed == "public":
        return True
    if needed == "node":
        return caller in ("node", "admin")  # an operator's hand-made report needs the admin token
    return caller not in ("nobody", "node") and at_least(caller, needed)


def test_every_route_has_a_role_decision() -> None:
    decided = table()
    schema = create_app(Settings(database_url="postgresql+asyncpg://unused/unused")).openapi()
    documented = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}
    assert documented == set(decided)  # the table is the whole API, nothing more
    assert decided[("POST", "/v1/allocations")] == "member"
    assert decided[("POST", "/v1/allocations/{allocation_id}/retry")] == "operator"
    assert decided[("PUT", "/v1/fleet")] == "admin"


@pytest.mark.parametrize("caller", CALLERS)
async def test_each_role_reaches_exactly_its_routes(stack: Stack, caller: str) -> None:
    async with stack.lab.sessions.begin() as session:
        tokens = {
            "viewer": await create_token(session, "viewer", "acme", label="table"),
            "member": await create_token(session, "member", "acme", label="table"),
            "operator": await create_token(session, "operator", label="table"),
            "admin": await create_token(session, "admin", label="table"),
            "node": await create_token(session, "node", node="small", label="table"),
        }
    headers = bearer(tokens[caller]) if caller in tokens else {}
    wrong: list[str] = []
    for (method, path), needed in sorted(table().items()):
        url = re.sub(r"\{(\w+)\}", lambda m: PLACEHOLDERS.get(m.group(1), "nosuch"), path)
        body: dict[str, Any] = {"json": {}} if method in ("POST", "PUT") else {}
        answer = await stack.http.request(method, url, headers=headers, **body)
        refused = answer.status_code in (401, 403)
        if allowed(caller, needed) == refused:
            wrong.append(f"{method} {path} (needs {needed}): {answer.status_code} {answer.text[:160]}")
        elif refused and answer.status_code != (401 if caller == "nobody" else 403):
            wrong.append(f"{method} {path}: {answer.status_code} for {caller}")
    assert not wrong, f"as {caller}:\n" + "\n".join(wrong)
