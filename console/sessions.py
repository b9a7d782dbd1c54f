"""Who is signed in to the console: a session cookie that holds only a random secret, and a row in PostgreSQL
(store/console_sessions.py) found by that secret's SHA-256 and holding the bearer sealed with a key derived from the
secret, so neither the table nor the cookie alone is a credential.

The bearer is what the API takes: a person's OIDC ID token (refreshed with its refresh token before it expires) or
a Berth token pasted at the login page. The console sends it with every call it makes to the API, which decides
what the person may see and do; the console holds no rule of its own.

The cookie is HttpOnly, SameSite=Lax and, when the browser came over TLS (itself, or through a proxy that says so in
X-Forwarded-Proto), Secure. Every action is a POST that
carries the session's CSRF token (an HMAC of the secret, so it needs no storage) and, when the browser says where
it comes from, an Origin of this very site.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeVar

import httpx
from cryptography.fernet import Fernet, InvalidToken
from fastapi import Request, Response
from pydantic import BaseModel

from berth.credentials import client_auth, id_token_claims
from berth.errors import BerthError
from store import console_sessions

COOKIE = "berth_console"
PENDING_COOKIE = "berth_console_login"
SESSION_HOURS = 12.0  # a day's work; a person's ID token is refreshed inside it, a pasted token is kept as is
PENDING_SECONDS = 600.0  # from the redirect to the provider to its answer
REFRESH_AHEAD_SECONDS = 60.0
PATH = "/console"

M = TypeVar("M", bound=BaseModel)


class Held(BaseModel):
    """What a session holds, sealed."""

    bearer: str
    kind: Literal["token", "person"]
    refresh_token: str | None = None
    token_endpoint: str | None = None
    client_id: str | None = None
    expires_at: float | None = None  # a person's ID token's `exp`


class Pending(BaseModel):
    """A login sent to the identity provider, until its answer comes back (authorization code with PKCE)."""

    state: str
    verifier: str
    nonce: str
    redirect_uri: str
    token_endpoint: str
    client_id: str
    back_to: str


def _key(secret: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"berth-console-seal\0" + secret.encode()).digest()))


def seal(secret: str, held: BaseModel) -> str:
    return _key(secret).encrypt(held.model_dump_json().encode()).decode()


def unseal(secret: str, sealed: str, model: type[M]) -> M | None:
    try:
        return model.model_validate_json(_key(secret).decrypt(sealed.encode()))
    except (InvalidToken, ValueError):
        return None


def csrf_token(secret: str) -> str:
    """The session's CSRF token: what its pages put in every form, derived from the secret the cookie holds."""
    return hmac.new(secret.encode(), b"berth-console-csrf", hashlib.sha256).hexdigest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def public_scheme(request: Request) -> str:
    """The scheme the browser used: `https` behind a proxy that ended TLS and says so (X-Forwarded-Proto, as
    Kubernetes ingresses do) though the request reached the API over plain HTTP. Believing the header can only make
    the cookie Secure and the login's redirect https: nothing a forged one could turn against someone else."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return "https" if "https" in (request.url.scheme, forwarded) else request.url.scheme


def set_cookie(request: Request, response: Response, name: str, secret: str, seconds: float) -> None:
    response.set_cookie(
        name,
        secret,
        max_age=int(seconds),
        path=PATH,
        httponly=True,
        samesite="lax",
        secure=public_scheme(request) == "https",
    )


def clear_cookie(response: Response, name: str) -> None:
    response.delete_cookie(name, path=PATH)


def same_origin(request: Request) -> bool:
    """A POST's Origin, when the browser sends one, is this site's: a page elsewhere cannot post to the console."""
    origin = request.headers.get("origin")
    here = {f"{scheme}://{request.url.netloc}" for scheme in (request.url.scheme, public_scheme(request))}
    return origin is None or origin in here


async def open_session(request: Request, response: Response, held: Held, actor: str) -> None:
    """A new session for `held` (a new secret: a login never reuses the cookie it came with)."""
    secret = new_secret()
    until = datetime.now(UTC) + timedelta(hours=SESSION_HOURS)
    async with request.app.state.services.sessions.begin() as session:
        await console_sessions.keep(session, secret, "session", seal(secret, held), until, actor)
    set_cookie(request, response, COOKIE, secret, SESSION_HOURS * 3600)


async def session_of(request: Request) -> tuple[str, Held] | None:
    """The signed-in session of this request (its secret and what it holds), its person's ID token refreshed when
    it is about to expire; None when there is none, or it ended."""
    secret = request.cookies.get(COOKIE)
    if not secret:
        return None
    sessions = request.app.state.services.sessions
    async with sessions() as session:
        row = await console_sessions.find(session, secret, "session")
    held = unseal(secret, row.sealed, Held) if row is not None else None
    if row is None or held is None:
        return None
    if held.kind == "person" and held.expires_at is not None and held.expires_at - time.time() < REFRESH_AHEAD_SECONDS:
        refreshed = await _refreshed(held, request.app.state.settings.oidc_client_secret)
        if refreshed is None:
            return None
        held = refreshed
        async with sessions.begin() as session:
            await console_sessions.keep(session, secret, "session", seal(secret, held), row.expires_at, row.actor)
    return secret, held


async def _refreshed(held: Held, client_secret: str | None) -> Held | None:
    """The person's ID token renewed with the refresh token; None when it cannot be (they log in again)."""
    if not (held.refresh_token and held.token_endpoint and held.client_id):
        return None
    named, auth = client_auth(held.client_id, client_secret)
    try:
        async with httpx.AsyncClient(timeout=30.0) as http:
            answer = await http.post(
                held.token_endpoint,
                data={"grant_type": "refresh_token", "refresh_token": held.refresh_token, **named},
                auth=auth,
            )
        tokens = answer.json() if answer.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    id_token = tokens.get("id_token")
    try:
        expires = float(id_token_claims(id_token).get("exp", time.time() + 300)) if isinstance(id_token, str) else None
    except (BerthError, TypeError, ValueError):  # an unreadable token: the person signs in again
        expires = None
    if expires is None:
        return None
    return held.model_copy(
        update={
            "bearer": id_token,
            "refresh_token": tokens.get("refresh_token") or held.refresh_token,
            "expires_at": expires,
        }
    )


async def close_session(request: Request, response: Response) -> None:
    secret = request.cookies.get(COOKIE)
    if secret:
        async with request.app.state.services.sessions.begin() as session:
            await console_sessions.forget(session, secret)
    clear_cookie(response, COOKIE)
