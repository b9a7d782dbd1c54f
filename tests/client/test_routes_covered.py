"""Every route of the API has a client method, and every method calls a route the API has: the routes each
resource method declares (`berth.routes.calls`) against the API's OpenAPI schema. A route added to the API without
a method in berth/ fails here, naming it."""

from __future__ import annotations

import subprocess
import sys

from api.app import create_app
from berth.routes import declared
from config.settings import Settings

HIDDEN = {("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}


def schema_routes() -> set[tuple[str, str]]:
    paths = create_app(Settings(), sessions=None, temporal=None).openapi()["paths"]
    return {(method.upper(), path) for path, operations in paths.items() for method in operations} - HIDDEN


def test_every_route_of_the_schema_has_a_client_method() -> None:
    missing = sorted(schema_routes() - set(declared()))
    assert not missing, f"routes with no method in berth/: {missing}"


def test_every_declared_route_is_in_the_schema() -> None:
    unknown = {route: where for route, where in declared().items() if route not in schema_routes()}
    assert not unknown, f"client methods calling routes the API does not have: {unknown}"


def test_the_client_imports_nothing_of_the_server() -> None:
    """A client-only install has no server packages: importing berth must not need them."""
    forbidden = (
        "api", "store", "workflows", "activities", "devstack", "gateway", "agent", "scheduler", "fleet",
        "temporalio", "sqlalchemy", "asyncpg", "fastapi",
    )  # fmt: skip
    code = "import sys, berth; berth.Client; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert not [name for name in loaded if name.split(".")[0] in forbidden]
