"""The web console: the fleet, the queues, the allocations, the usage and the reservations, for people who would
rather look than read, served by the API process under /console (console/README.md)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles


def install(app: FastAPI) -> None:
    """Serve the console under /console: its pages, and its own CSS and JavaScript (no CDN, no build step)."""
    from console import login, pages  # noqa: F401 - each module adds its routes to the router
    from console.web import HERE, router

    app.include_router(router)
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")
