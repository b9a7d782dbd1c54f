"""How the `berth` commands reach the HTTP API: where it is, which token to send, and every failure as one line.

The API and token come from `--api` / `--token`, else `BERTH_API_URL` / `BERTH_TOKEN`, else the login `berth login`
kept for that API (berth/credentials.py), else the `context.json` that `berth up` writes (found as `config.context` finds
it: `BERTH_CONTEXT`, this directory and its parents, the user's config directory), so a second terminal next to
`berth up` needs no flags. From the context file the admin
token is used unless `--tenant NAME` picks that tenant's token: then the command acts exactly as the tenant would.

The commands call the API through the Python client, `berth.Client` (berth/), as any script would: the same target,
the same typed answers. Whatever goes wrong (the API unreachable, a 4xx or 5xx in the API's error envelope, an
answer that is not the API's) reaches the person as one line and a non-zero exit, through `api_client()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated
from urllib.parse import quote

import httpx
import typer
from pydantic import ValidationError

from berth import Client, Retries, Timeouts, target
from berth.errors import BerthError, Unreachable
from berth.target import Target
from cli.api_failure import ApiFailure
from cli.credentials import as_api_failure
from cli.output import errors, fail
from config.context import StackContext, discovered_context
from config.settings import Settings

ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api", envvar="BERTH_API_URL", help="Base URL of the Berth API; default: the one `berth up` started."
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="BERTH_TOKEN",
        help="API bearer token; default: `berth up`'s admin token, or the --tenant's token.",
    ),
]
TenantOption = Annotated[
    str | None,
    typer.Option("--tenant", help="Act for this tenant: its token from `berth up`'s context, its name in the request."),
]

TIMEOUT_SECONDS = 30.0  # above the API's own Temporal call timeouts, so its 503 arrives before ours


def api_url(api: str | None, context: StackContext | None = None) -> str:
    """The API a command talks to: `--api` / BERTH_API_URL, else the one `berth up` started."""
    try:
        return target.api_url(api, context)
    except BerthError as error:
        raise as_api_failure(error) from error


def resolve_target(api: str | None, token: str | None, tenant: str | None = None) -> Target:
    """Where to send requests and with which token, resolved as `berth.Client` resolves it (berth/target.py):
    explicit values first (Typer has read BERTH_API_URL and BERTH_TOKEN into them), then the login, then `berth
    up`'s context file, whose token is only ever sent to the context's own API."""
    try:
        return target.resolve_target(api, token, tenant)
    except BerthError as error:
        raise as_api_failure(error) from error


def default_tenant() -> str | None:
    """The tenant an allocation is for when no one named one and the dev stack's admin token is in use: the first
    tenant of `context.json`, so `berth alloc create --gpus 2` works right after `berth up`."""
    context = discovered_context(Settings())
    return min(context.tenant_tokens) if context and context.tenant_tokens else None


def acting_tenant(tenant: str | None, token: str | None, announce: bool) -> str | None:
    """The tenant a create is for: the one named, else (no token named either) `default_tenant`, announced on
    stderr when `announce` so that nobody acts for a tenant unawares."""
    if tenant is not None or token is not None:
        return tenant
    tenant = default_tenant()
    if tenant is not None and announce:
        errors.print(
            f"acting for tenant {tenant}, the first in `berth up`'s context (choose with --tenant)",
            style="dim",
            highlight=False,
        )
    return tenant


def segment(value: str) -> str:
    """A value made safe as one path segment: an id with a `/` must not reach another route."""
    return quote(value, safe="")


# A person at a terminal decides whether to try again: the CLI sends each request once and says what came back.
ONCE = Retries(attempts=1)


@contextmanager
def api_client(api: str | None, token: str | None, tenant: str | None = None) -> Iterator[Client]:
    """The Python client (`berth.Client`) for the command's duration, its target resolved from the flags; any
    failure inside becomes one line on stderr and exit code 1."""
    try:
        target = resolve_target(api, token, tenant)
        with Client(target.url, target.token, retries=ONCE, timeouts=Timeouts(read=TIMEOUT_SECONDS)) as client:
            yield client
    except ApiFailure as error:
        if error.status is None:
            fail(str(error))
        fail(error.message, reason=error.code, status=error.status, details=error.details)
    except Unreachable as error:
        fail(_with_hint(error.message))
    except BerthError as error:
        fail(error.message, reason=error.code, status=error.status, details=error.details)
    except httpx.InvalidURL as error:
        fail(f"--api: {error}", reason="invalid_argument")
    except ValidationError as error:  # the answer parsed, but not into what this version of berth expects
        fail(f"the API answered in an unexpected shape (is it another version of Berth?): {error.errors()[0]['msg']}")


def _with_hint(message: str) -> str:
    """`cannot reach the Berth API at URL: WHY` -> `... at URL: is `berth up` running? (WHY)`: the usual cause
    next to a person's terminal."""
    head, _, why = message.partition(": ")
    return f"{head}: is `berth up` running? ({why})" if why else message
