"""`GET /healthz` and `GET /metrics`: unauthenticated, for load balancers and Prometheus."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.errors import ApiError, error_responses
from api.services import Services, services
from contracts.http import Health
from store.db import ping

router = APIRouter(tags=["operations"])
App = Annotated[Services, Depends(services)]


async def _database_ok(app: Services) -> bool:
    try:
        async with app.sessions() as session:
            await ping(session)
        return True
    except Exception:  # any failure to answer SELECT 1 is "unreachable" to a health check
        return False


@router.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": "Unavailable."}})
async def healthz(app: App, response: Response) -> Health:
    """200 when PostgreSQL and Temporal answer (`degraded` if no control worker polls); 503 otherwise."""
    database, temporal = await _database_ok(app), await app.control.reachable()
    workers = 0
    if temporal:
        try:
            workers = await app.control.control_workers()
        except ApiError:
            temporal = False
    if not (database and temporal):
        response.status_code = 503
        status = "unavailable"
    else:
        status = "ok" if workers else "degraded"
    return Health(
        status=status,
        database="ok" if database else "unreachable",
        temporal="ok" if temporal else "unreachable",
        control_workers=workers,
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."},
        **error_responses(503),
    },
)
async def metrics(app: App) -> Response:
    """Requests by route and status, allocations by state, refusals by reason code, capacity, agents and placement
    latency (api/metrics.py lists them)."""
    try:
        workers: int | None = await app.control.control_workers()
    except ApiError:  # Temporal does not answer: -1, which the no-control-worker alert also catches
        workers = None
    async with app.sessions() as session:
        body = await app.metrics.render(session, workers)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
