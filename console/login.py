"""Signing in to the console and out of it.

- With the API's OIDC provider (`BERTH_OIDC_ISSUER_URL`): the authorization code flow with PKCE, the code exchanged
  by the API process (with `BERTH_OIDC_CLIENT_SECRET` when the client has one), the ID token kept sealed in the
  session and refreshed before it expires. The provider must allow `<console>/console/auth/callback` as a redirect.
- With a Berth token pasted in the form: for the dev stack (`berth up` prints its admin and tenants' tokens' file)
  and for service accounts; the token must be one the API takes.

Either way the API says who it is (`GET /v1/whoami`) before a session is opened, and a new session never reuses the
cookie the browser came with.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode

import httpx
from fastapi import Request
from fastapi.responses import Response

import berth
from berth.credentials import client_auth, id_token_claims
from console import sessions
from console.web import back, client_for, page, router
from store import console_sessions


def _next(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site: no open redirect)."""
    return value if value and value.startswith("/console") and not value.startswith("//") else "/console/"


@router.get("/login")
async def login_page(request: Request, next: str | None = None, problem: str | None = None) -> Response:
    settings = request.app.state.settings
    return page(
        request,
        None,
        "login.html",
        issuer=settings.oidc_issuer_url,
        next=_next(next),
        problem=problem,
    )


@router.post("/login/token")
async def login_with_token(request: Request) -> Response:
    """A Berth token pasted in the form: a session once the API takes it."""
    if not sessions.same_origin(request):
        return page(request, None, "login.html", issuer=None, next="/console/", problem="refused: not this site's form")
    fields = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
    token, goal = fields.get("token", "").strip(), _next(fields.get("next"))
    if not token or not token.isascii() or not token.isprintable():
        return back(f"/console/login?{urlencode({'next': goal, 'problem': 'Paste a Berth token.'})}")
    api = client_for(request, token)
    try:
        me = await api.whoami()
    except berth.BerthError:
        me = None
    finally:
        await api.aclose()
    if me is None:
        return back(f"/console/login?{urlencode({'next': goal, 'problem': 'The API does not take that token.'})}")
    answer = back(goal)
    await sessions.open_session(request, answer, sessions.Held(bearer=token, kind="token"), me.actor)
    return answer


@router.get("/login/oidc")
async def login_with_provider(request: Request, next: str | None = None) -> Response:
    """Off to the identity provider, with a login kept pending under a cookie of its own."""
    settings = request.app.state.settings
    if settings.oidc_issuer_url is None or settings.oidc_client_id is None:
        return back("/console/login?problem=This+API+has+no+identity+provider%3A+use+a+token.")
    try:
        async with httpx.AsyncClient(timeout=30.0) as http:
            found = (await http.get(settings.oidc_issuer_url.rstrip("/") + "/.well-known/openid-configuration")).json()
        authorize, token_endpoint = found["authorization_endpoint"], found["token_endpoint"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return back("/console/login?problem=The+identity+provider+does+not+answer%3B+try+again+later.")
    verifier, state, nonce = secrets.token_urlsafe(64), secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    redirect_uri = str(request.url_for("console_callback").replace(scheme=sessions.public_scheme(request)))
    pending = sessions.Pending(
        state=state,
        verifier=verifier,
        nonce=nonce,
        redirect_uri=redirect_uri,
        token_endpoint=token_endpoint,
        client_id=settings.oidc_client_id,
        back_to=_next(next),
    )
    secret = sessions.new_secret()
    until = datetime.now(UTC) + timedelta(seconds=sessions.PENDING_SECONDS)
    async with request.app.state.services.sessions.begin() as session:
        await console_sessions.keep(session, secret, "pending", sessions.seal(secret, pending), until)
    query = {
        "response_type": "code",
        "client_id": settings.oidc_client_id,
        "redirect_uri": redirect_uri,
        "scope": " ".join(
            ["openid", "email", "profile", *(["groups"] if settings.oidc_groups_claim == "groups" else [])]
        ),
        "state": state,
        "nonce": nonce,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    answer = back(f"{authorize}?{urlencode(query)}")
    sessions.set_cookie(request, answer, sessions.PENDING_COOKIE, secret, sessions.PENDING_SECONDS)
    return answer


@router.get("/auth/callback", name="console_callback")
async def callback(request: Request, code: str | None = None, state: str | None = None) -> Response:
    """The provider's answer: the code exchanged for tokens, a session opened for the person the API names."""
    secret = request.cookies.get(sessions.PENDING_COOKIE)
    pending = None
    if secret:
        async with request.app.state.services.sessions.begin() as session:
            row = await console_sessions.find(session, secret, "pending")
            await console_sessions.forget(session, secret)  # one answer per login, whatever it says
        pending = sessions.unseal(secret, row.sealed, sessions.Pending) if row is not None else None
    if pending is None or state != pending.state or not code:
        return back("/console/login?problem=That+login+answer+is+not+this+browser%27s%3A+log+in+again.")
    named, auth = client_auth(pending.client_id, request.app.state.settings.oidc_client_secret)
    try:
        async with httpx.AsyncClient(timeout=30.0) as http:
            exchanged = await http.post(
                pending.token_endpoint,
                data={
                    "grant_type": "authorization_code",
                    "code": code,
                    "redirect_uri": pending.redirect_uri,
                    "code_verifier": pending.verifier,
                    **named,
                },
                auth=auth,
            )
        tokens = exchanged.json() if exchanged.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        tokens = {}
    id_token = tokens.get("id_token")
    if not isinstance(id_token, str):
        return back("/console/login?problem=The+identity+provider+gave+no+ID+token%3A+log+in+again.")
    try:
        claims = id_token_claims(id_token)
    except berth.BerthError:
        return back("/console/login?problem=The+identity+provider+gave+an+unreadable+ID+token%3A+log+in+again.")
    if claims.get("nonce") != pending.nonce:  # OpenID Connect: sent with the request, it must come back
        return back("/console/login?problem=That+ID+token+is+not+this+login%27s%3A+log+in+again.")
    held = sessions.Held(
        bearer=id_token,
        kind="person",
        refresh_token=tokens.get("refresh_token"),
        token_endpoint=pending.token_endpoint,
        client_id=pending.client_id,
        expires_at=float(claims.get("exp", time.time() + 300)),
    )
    api = client_for(request, id_token)
    try:
        me = await api.whoami()
    except berth.BerthError as error:
        return back(f"/console/login?{urlencode({'problem': f'The API refused the login: {error.message}'})}")
    finally:
        await api.aclose()
    answer = back(pending.back_to)
    sessions.clear_cookie(answer, sessions.PENDING_COOKIE)
    await sessions.open_session(request, answer, held, me.actor)
    return answer


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out: the session's row is deleted (its bearer with it) and the cookie cleared."""
    fields = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
    secret = request.cookies.get(sessions.COOKIE)
    if not sessions.same_origin(request) or not secret or fields.get("csrf") != sessions.csrf_token(secret):
        return back("/console/")
    answer = back("/console/login")
    await sessions.close_session(request, answer)
    return answer
