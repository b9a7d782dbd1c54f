"""How the `berth` commands reach the HTTP API: where it is, which token to send, and every failure as one line.

The API and token come from `--api` / `--token`, else `BERTH_API_URL` / `BERTH_TOKEN`, else the login `berth login`
kept for that API (berth/credentials.py), else the `context.json` that `berth up` writes (found as `config.context` finds
it: `BERTH_CONTEXT`, this directory and its parents, the user's config directory), so a second terminal next to
`berth up` needs no flags. From the context file the admin
token is used unless `--tenant NAME` picks that tenant's token: then the command acts exactly as the tenant would.

Whatever goes wrong (the API unreachable, a 4xx or 5xx in the API's error envelope, an answer that is not the
API's) reaches the person as one line and a non-zero exit, through `api_client()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from pydantic import ValidationError

from berth import target
from berth.errors import BerthError
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


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _failure(response: httpx.Response) -> ApiFailure:
    """The API's error envelope as one line; anything else (a proxy's page, say) by its status alone."""
    status = response.status_code
    try:
        error = response.json()["error"]
        message, code = _one_line(str(error["message"])), str(error["code"])
    except (ValueError, KeyError, TypeError):
        return ApiFailure(f"the API answered HTTP {status} {response.reason_phrase}")
    return ApiFailure(
        f"{message} ({code}, HTTP {status})", message=message, code=code, status=status, details=error.get("details")
    )


class BerthClient:
    """A bearer-token HTTP client for the API: each call returns the decoded JSON body or raises `ApiFailure`."""

    def __init__(self, target: Target, timeout: float = TIMEOUT_SECONDS) -> None:
        self.url = target.url
        self._http = httpx.Client(
            base_url=target.url, headers={"Authorization": f"Bearer {target.token}"}, timeout=timeout
        )

    def __enter__(self) -> BerthClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._http.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        query = {key: value for key, value in (params or {}).items() if value is not None}
        try:
            response = self._http.request(method, path, json=json, params=query, headers=headers)
        except httpx.TimeoutException as error:
            raise ApiFailure(f"the Berth API at {self.url} did not answer in time ({type(error).__name__})") from error
        except httpx.TransportError as error:
            raise ApiFailure(f"cannot reach the Berth API at {self.url}: is `berth up` running? ({error})") from error
        if response.is_error:
            raise _failure(response)
        try:
            return response.json()
        except ValueError as error:
            raise ApiFailure(
                f"the API at {self.url} answered {method} {path} with something other than JSON"
            ) from error


@contextmanager
def api_client(api: str | None, token: str | None, tenant: str | None = None) -> Iterator[BerthClient]:
    """A client for the command's duration; any failure inside becomes one line on stderr and exit code 1."""
    try:
        with BerthClient(resolve_target(api, token, tenant)) as client:
            yield client
    except ApiFailure as error:
        if error.status is None:
            fail(str(error))
        fail(error.message, reason=error.code, status=error.status, details=error.details)
    except httpx.InvalidURL as error:
        fail(f"--api: {error}", reason="invalid_argument")
    except ValidationError as error:  # the answer parsed, but not into what this version of berth expects
        fail(f"the API answered in an unexpected shape (is it another version of Berth?): {error.errors()[0]['msg']}")
