"""What `berth login` keeps: a person's tokens per API URL, in a file only its owner reads
(`$XDG_CONFIG_HOME/berth/credentials.json`, mode 0600), and the ID token every later call to that API sends,
refreshed with the refresh token a minute before it expires (`logged_in_token`).

The `berth login` command fills and empties it (cli/login.py); the library's target resolution (berth/target.py)
and through it the CLI ask it for the bearer to send. Failures are `BerthError`s: `login_expired` (401) when the
person must log in again, `identity_provider` when the provider could not be asked.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from berth.errors import BerthError, Unauthorized
from config.context import user_config_dir, write_private
from config.identity import unverified_claims

REFRESH_AHEAD_SECONDS = 60.0


class Credentials(BaseModel):
    """What `berth login` keeps for one API: the tokens and where to refresh them."""

    issuer: str
    client_id: str
    client_secret: str | None = None  # a client that must authenticate (Google's "installed app" kind)
    token_endpoint: str
    id_token: str
    refresh_token: str | None = None
    expires_at: float  # the ID token's `exp`


def credentials_file() -> Path:
    return user_config_dir() / "credentials.json"


def load_all() -> dict[str, Any]:
    try:
        found = json.loads(credentials_file().read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def save(api: str, credentials: Credentials | None) -> Path:
    everything = load_all()
    if credentials is None:
        everything.pop(api, None)
    else:
        everything[api] = credentials.model_dump()
    path = credentials_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return write_private(path, json.dumps(everything, indent=2) + "\n")


def id_token_claims(id_token: str) -> dict[str, Any]:
    """The ID token's claims, unverified (the API verifies; the client only wants `exp` and a name)."""
    try:
        return unverified_claims(id_token)
    except ValueError as error:
        raise BerthError(f"the provider's ID token is {error}", code="identity_provider") from error


def client_auth(client_id: str, secret: str | None) -> tuple[dict[str, str], tuple[str, str] | None]:
    """How the client shows itself to the token endpoint: HTTP Basic with its secret when it has one (the method
    every provider must take, RFC 6749 section 2.3.1), else as a public client naming itself (PKCE protects it)."""
    return ({}, (client_id, secret)) if secret else ({"client_id": client_id}, None)


def from_token_answer(answer: dict[str, Any], before: Credentials) -> Credentials:
    id_token = answer.get("id_token")
    if not isinstance(id_token, str):
        raise BerthError(
            "the provider answered without an ID token (is the `openid` scope allowed for the client?)",
            code="identity_provider",
        )
    return before.model_copy(
        update={
            "id_token": id_token,
            "refresh_token": answer.get("refresh_token") or before.refresh_token,
            "expires_at": float(id_token_claims(id_token).get("exp", time.time() + 300)),
        }
    )


def logged_in_token(api: str) -> str | None:
    """The ID token `berth login` keeps for `api`, refreshed when it is about to expire; None when no one logged
    in there. A refresh that is refused raises `Unauthorized` (`login_expired`): the person must log in again."""
    found = load_all().get(api.rstrip("/"))
    if found is None:
        return None
    try:
        credentials = Credentials.model_validate(found)
    except ValidationError:
        return None
    if credentials.expires_at - time.time() > REFRESH_AHEAD_SECONDS:
        return credentials.id_token
    if credentials.refresh_token is None:
        raise Unauthorized(f"your login to {api} has expired: run `berth login --api {api}`", code="login_expired")
    named, auth = client_auth(credentials.client_id, credentials.client_secret)
    try:
        answer = httpx.post(
            credentials.token_endpoint,
            data={"grant_type": "refresh_token", "refresh_token": credentials.refresh_token, **named},
            auth=auth,
            timeout=30.0,
        )
    except httpx.HTTPError as error:
        raise BerthError(
            f"cannot refresh your login at {credentials.token_endpoint}: {error}", code="identity_provider"
        ) from error
    if answer.status_code != 200:
        raise Unauthorized(
            f"your login to {api} can no longer be refreshed: run `berth login --api {api}`", code="login_expired"
        )
    refreshed = from_token_answer(answer.json(), credentials)
    save(api.rstrip("/"), refreshed)
    return refreshed.id_token
