"""The console's pages, a module each; importing this package adds their routes to `console.web.router`."""

from fastapi.responses import RedirectResponse

from console.pages import allocations, fleet, health, nodes, queues, reservations, usage  # noqa: F401
from console.web import router


@router.get("/")
async def home() -> RedirectResponse:
    """The console opens on the fleet."""
    return RedirectResponse("/console/fleet", status_code=303)
