"""The Berth HTTP API (DESIGN.md section 6) as a FastAPI application.

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
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from api import errors
from api.body_limit import BodyLimit, BodyLimits
from api.metrics import Metrics, RequestCounter
from api.routes import allocations, audit, deployments, fleet, health, nodes, placement
from api.services import Services
from api.steady_reports import SteadyReports
from api.temporal import ControlPlane, TemporalTimeouts
from config.context import database_url
from config.settings import Settings, get_settings
from config.temporal import connect
from store.db import create_engine, session_factory
from workflows.allocation_messages import Timing
from workflows.deployment_messages import DeploymentTiming
from workflows.task_queues import Queues


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
) -> FastAPI:
    settings = settings or get_settings()
    queues = queues or Queues(control=settings.control_task_queue, node_prefix=settings.node_task_queue_prefix)
    services = Services(
        control=ControlPlane(temporal or (lambda: connect(settings)), queues, timeouts or TemporalTimeouts()),
        timing=timing or Timing(),
        metrics=Metrics(),
        database=sessions,
        deployment_timing=deployment_timing or DeploymentTiming(),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if services.database is not None:
            yield
            return
        engine = create_engine(database_url(settings))
        services.database = session_factory(engine)
        try:
            yield
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
    app.add_middleware(RequestCounter, metrics=services.metrics)
    # nodes first: its report route is what every agent calls every interval, and routes are matched in order.
    for module in (nodes, allocations, deployments, placement, fleet, audit, health):
        app.include_router(module.router)
    _document_body_limits(app)
    return app


def _document_body_limits(app: FastAPI) -> None:
    """Every operation that takes a body may answer 413 (api/body_limit.py); say so in the published schema."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            for operations in build().get("paths", {}).values():
                for operation in operations.values():
                    if isinstance(operation, dict) and "requestBody" in operation:
                        operation.setdefault("responses", {})["413"] = errors.openapi_error(413)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
