"""The console's plumbing: its router under `/console`, its templates and static files, who is signed in
(`Visitor`), the API client that acts for them, and how a page is answered (whole, or only its live part).

The console is a client of the API: every page asks the API for what it shows, through the Python client
(`berth.AsyncClient`) sent in-process to the very app that serves the console (an ASGI transport: no socket, no
second server), with the visitor's own bearer. So the API's roles decide what each person sees and may do, its
request log names them, and the console holds no rule of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

import httpx
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

import berth
from console import sessions
from contracts.http import WhoAmI

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
# Every console route: outside the API's published schema, which is the API's contract (the console is a client).
router = APIRouter(prefix="/console", include_in_schema=False)
IN_PROCESS = "http://berth.console"  # the base URL of in-process calls: never resolved, never on a network
LIVE_SECONDS = 5  # how often a page's live part is read again while it is visible


class SignInFirst(HTTPException):
    """No session: the browser goes to the login page, and back here after it."""

    def __init__(self, back_to: str) -> None:
        super().__init__(303, headers={"Location": f"/console/login?next={quote(back_to, safe='')}"})


@dataclass
class Visitor:
    """The person (or token) signed in to this request: who the API says they are, the API client acting for them,
    and the CSRF token their forms carry."""

    me: WhoAmI
    api: berth.AsyncClient
    csrf: str

    @property
    def operator(self) -> bool:
        return self.me.role in ("operator", "admin")

    def member_of(self, tenant: str) -> bool:
        return self.me.all_tenants or self.me.tenants.get(tenant) in ("member",)


def client_for(request: Request, bearer: str) -> berth.AsyncClient:
    """The Python client, acting with `bearer`, in-process against the app that serves this request. Sent once: a
    person at a page decides whether to try again."""
    transport = httpx.ASGITransport(app=request.app)
    return berth.AsyncClient(IN_PROCESS, bearer, retries=berth.Retries(attempts=1), transport=transport)


async def visitor(request: Request) -> AsyncIterator[Visitor]:
    """The signed-in visitor, or a redirect to the login page."""
    found = await sessions.session_of(request)
    if found is None:
        raise SignInFirst(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    secret, held = found
    api = client_for(request, held.bearer)
    try:
        try:
            me = await api.whoami()
        except berth.Unauthorized as error:  # revoked, or expired beyond refreshing: sign in again
            raise SignInFirst(request.url.path) from error
        yield Visitor(me, api, sessions.csrf_token(secret))
    finally:
        await api.aclose()


SignedIn = Annotated[Visitor, Depends(visitor)]


async def form(request: Request, visitor: Visitor) -> dict[str, str]:
    """A posted form's fields, once its CSRF token and its origin are this session's; else 403."""
    body = (await request.body()).decode("utf-8", "replace")
    fields = {key: values[-1] for key, values in parse_qs(body, keep_blank_values=True).items()}
    if not sessions.same_origin(request) or fields.get("csrf") != visitor.csrf:
        raise HTTPException(403, "this form did not come from this session's console page (CSRF): reload and retry")
    return fields


def page(request: Request, visitor: Visitor | None, template: str, **context: Any) -> Response:
    """A page, or with `?live=1` only its `live` block: what live.js puts in place every LIVE_SECONDS."""
    values = {"request": request, "visitor": visitor, "live_seconds": LIVE_SECONDS, **context}
    if request.query_params.get("live") == "1":
        compiled = templates.get_template(template)
        block = compiled.blocks.get("live")
        if block is None:
            raise HTTPException(404, f"{template} has no live part")
        return HTMLResponse("".join(block(compiled.new_context(values))))
    return templates.TemplateResponse(request, template, values)


def back(location: str) -> RedirectResponse:
    return RedirectResponse(location, status_code=303)
