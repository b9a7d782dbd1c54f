"""The Berth HTTP API (docs/design.md section 6) as a FastAPI application.

    uvicorn --factory api.app:create_app        production: settings from BERTH_* variables (or `berth up`'s context)
    create_app(settings, sessions=..., temporal=..., queues=..., timing=...)   tests and embedders inject their own

Whatever is not injected is built from the settings: the database engine when the app starts (and disposed when
it stops), the Temporal client on first use, so the API comes up and serves reads while Temporal is still starting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI
from temporalio.client import Client

import console
from api import errors
from api.body_limit import BodyLimit, BodyLimits
from api.metrics import Metrics, RequestCounter
from api.oidc import OidcVerifier
from api.rate_limit import CreateLimits, Limit
from api.request_log import RequestLog
from api.routes import (
    allocations,
    audit,
    deployments,
    fleet,
    health,
    identity,
    nodes,
    placement,
    reservations,
    tokens,
    usage,
)
from api.routes import queues as queue_routes
from api.services import Services
from api.steady_reports import SteadyReports
from api.temporal import ControlPlane, TemporalTimeouts
from config import tracing
from config.context import database_url
from config.settings import Settings, get_settings
from config.temporal import connect
from contracts.task_queues import Queues
from fleet.deployment import ModelDeployment
from store.db import AsyncSession, async_sessionmaker, create_engine, session_factory
from workflows.allocation.messages import Timing
from workflows.deployment.messages import DeploymentTiming


def _version() -> str:
    try:
        return version("berth")
    except PackageNotFoundError:
        return "0.0.0"


def create_app(
    settings: Settings | None = None,
    *,
    sessions: async_sessionmaker[AsyncSession] | None = None,
    temporal: Client | None = None,
    queues: Queues | None = None,
    timing: Timing | None = None,
    timeouts: TemporalTimeouts | None = None,
    deployment_timing: DeploymentTiming | None = None,
    traced: bool | None = None,
) -> FastAPI:
    """The API. `traced`: FastAPI's OpenTelemetry instrumentation (default: when OTEL_EXPORTER_OTLP_ENDPOINT is set,
    config/tracing.py)."""
    settings = settings or get_settings()
    queues = queues or Queues(control=settings.control_task_queue, node_prefix=settings.node_task_queue_prefix)
    rate = settings.person_creates_per_second
    person_limit = Limit(rate, settings.person_create_burst) if rate is not None else None
    services = Services(
        control=ControlPlane(temporal or (lambda: connect(settings)), queues, timeouts or TemporalTimeouts()),
        timing=timing or Timing(),
        metrics=Metrics(),
        database=sessions,
        deployment_timing=deployment_timing or DeploymentTiming(),
        oidc=OidcVerifier(settings.oidc) if settings.oidc is not None else None,
        create_limits=CreateLimits(person=person_limit),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if services.database is not None:
            yield
            await services.admission_passes.close()
            return
        engine = create_engine(database_url(settings))
        services.database = session_factory(engine)
        try:
            yield
            await services.admission_passes.close()
        finally:
            await engine.dispose()

    app = FastAPI(
        title="Berth",
        version=_version(),
        summary="GPU capacity control plane: allocations, placement explanations, capacity and fleet inventory.",
        description="Authenticate with `Authorization: Bearer <token>`. Every error is "
        '`{"error": {"code", "message", "details"}}`; see api/README.md for the codes.',
        lifespan=lifespan,
    )
    app.state.services = services
    errors.install(app)
    app.add_middleware(SteadyReports, services=services)  # inside RequestCounter: its answers are counted too
    # Outside SteadyReports, which reads report bodies before routing: every body is bounded wherever it is read.
    app.add_middleware(BodyLimit, services=services, limits=BodyLimits.from_settings(settings))
    app.add_middleware(RequestLog, services=services)  # outside BodyLimit and the routes: reads whom they verified
    app.add_middleware(RequestCounter, metrics=services.metrics)
    # nodes first: its report route is what every agent calls every interval, and routes are matched in order.
    for module in (
        nodes,
        allocations,
        deployments,
        placement,
        queue_routes,
        reservations,
        usage,
        fleet,
        tokens,
        audit,
        identity,
        health,
    ):
        app.include_router(module.router)
    app.state.settings = settings
    console.install(app)
    _complete_openapi(app)
    tracing.configure("berth-api")
    tracing.instrument(app, on=traced)
    return app


def _complete_openapi(app: FastAPI) -> None:
    """What FastAPI cannot see from the routes, added to the published schema so that it says what the API does:
    every operation that takes a bearer may answer 401, 403 and 503 (api/auth.py), every one with a body 413
    (api/body_limit.py), a deployment PUT's body, which the route reads
    itself (JSON or YAML), is a ModelDeployment, and a report's host inventory holds no NUL character."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path, operations in schema.get("paths", {}).items():
                for method, operation in operations.items():
                    if not isinstance(operation, dict):
                        continue
                    if "security" in operation:  # who may call it (api/auth.py): any caller may be refused
                        for status in (401, 403, 503):  # 503: the identity provider's keys could not be read
                            operation.setdefault("responses", {}).setdefault(str(status), errors.openapi_error(status))
                    if "requestBody" not in operation:
                        continue
                    operation.setdefault("responses", {})["413"] = errors.openapi_error(413)
                    if method == "put" and path.endswith("/deployments/{name}"):
                        for media in operation["requestBody"]["content"].values():
                            media["schema"] = _model_deployment(schema)
            _storable_text(schema.get("components", {}).get("schemas", {}), "HostInventory")
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


# Text PostgreSQL can store: no NUL character (store/node_reports.py refuses an inventory holding one, 422).
STORABLE_TEXT = r"^[^\x00]*$"


def _storable_text(components: dict[str, Any], root: str) -> None:
    """Every string of the component `root` and those it refers to, keys included, is stated to hold no NUL: a
    host inventory is stored as JSONB, which cannot hold one (schemathesis found an inventory the published schema
    allowed refused for it). A string that already has a pattern or an enum keeps it."""
    seen: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        if not isinstance(node, dict):
            return
        reference = node.get("$ref")
        if isinstance(reference, str) and reference.startswith("#/components/schemas/"):
            name = reference.removeprefix("#/components/schemas/")
            if name not in seen and name in components:
                seen.add(name)
                walk(components[name])
        if node.get("type") == "string" and "pattern" not in node and "enum" not in node:
            node["pattern"] = STORABLE_TEXT
        names = node.get("propertyNames")
        if isinstance(names, dict) and "pattern" not in names:
            names["pattern"] = STORABLE_TEXT
        for key, value in node.items():
            if key != "propertyNames":
                walk(value)

    walk({"$ref": f"#/components/schemas/{root}"})


def _model_deployment(schema: dict[str, Any]) -> dict[str, str]:
    """ModelDeployment's JSON schema among the document's components, with `metadata.name` optional: a manifest
    without it (or without its namespace) takes the one its address names (workflows/deployment/spec.py)."""
    template = "#/components/schemas/{model}"
    model = ModelDeployment.model_json_schema(ref_template=template)
    definitions = {**model.pop("$defs", {}), "ModelDeployment": model}
    metadata = {key: value for key, value in definitions["ObjectMeta"].items() if key != "required"}
    metadata["description"] = "The deployment's metadata; `name` and `namespace` default to those of the address."
    definitions["ModelDeploymentMetadata"] = metadata
    model["properties"]["metadata"] = {"$ref": template.format(model="ModelDeploymentMetadata")}
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in definitions.items():
        if components.setdefault(name, definition) != definition:
            raise RuntimeError(f"two schemas named {name!r} in the OpenAPI document")
    return {"$ref": template.format(model="ModelDeployment")}
