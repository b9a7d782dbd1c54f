"""`berth login`, `berth whoami`, `berth logout`: a person's own identity from the company's OIDC provider.

`berth login` asks the API where people log in (`GET /v1/auth`: the issuer and the client id), then runs the OAuth
authorization-code flow with PKCE (RFC 7636) on a loopback redirect (RFC 8252), as kubelogin does:

    a one-off HTTP listener on 127.0.0.1, a random port       the redirect URI
    the provider's authorization page, in the browser          (or printed with --no-browser: open it anywhere)
    the code it redirects back with, checked against `state`   exchanged with the PKCE verifier for the tokens
    the tokens, per API URL, in a file only its owner reads    `$XDG_CONFIG_HOME/berth/credentials.json`, mode 0600

Every later command to that API sends the ID token as its bearer, and refreshes it with the refresh token a minute
before it expires (cli/credentials.py keeps and refreshes them); once the refresh is refused, it asks for `berth login`
again. `--token`, `BERTH_TOKEN` and a service account's token still win when given (cli/client.py).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import secrets
import sys
import threading
import webbrowser
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import typer

import berth
from cli.api_failure import ApiFailure
from cli.client import ApiOption, api_client, api_url
from cli.credentials import Credentials, client_auth, from_token_answer, id_token_claims, load_all, save
from cli.output import OutputFormat, OutputOption, console, fail, is_data, print_data
from config.context import discovered_context
from config.settings import Settings

LOGIN_SECONDS = 300.0  # how long the loopback listener waits for the browser


class _Callback(http.server.BaseHTTPRequestHandler):
    """The loopback redirect: takes the one answer the provider sends back, then says so to the browser."""

    answer: dict[str, str] | None = None
    arrived = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
        if urlparse(self.path).path != "/callback" or not ("code" in query or "error" in query):
            self.send_response(404)
            self.end_headers()
            return
        type(self).answer = query
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        self.wfile.write(
            b"Berth: you are logged in. You can close this tab.\n"
            if "code" in query
            else b"Berth: the login was refused. See your terminal.\n"
        )
        type(self).arrived.set()

    def log_message(self, format: str, *args: Any) -> None:  # the terminal is the person's, not a log
        return


def _api_url(api: str | None) -> str:
    try:
        return api_url(api, None if api else discovered_context(Settings()))
    except ApiFailure as error:
        fail(str(error))


def login(
    api: ApiOption = None,
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Print the login URL instead of opening a browser.")
    ] = False,
    client_secret: Annotated[
        str | None,
        typer.Option(
            "--client-secret",
            help="For a provider whose CLI client must authenticate (Google's installed apps): its secret; "
            "default BERTH_OIDC_CLIENT_SECRET.",
        ),
    ] = None,
) -> None:
    """Log in with your company's identity provider (OIDC, the authorization-code flow with PKCE) and keep the
    tokens for this API; later commands send them and refresh them."""
    url = _api_url(api)
    try:
        oidc = berth.auth_config(url, timeouts=berth.Timeouts(read=30.0)).oidc
    except berth.BerthError as error:
        fail(f"cannot ask {url} how to log in: {error}")
    except httpx.InvalidURL as error:
        fail(f"--api: {error}", reason="invalid_argument")
    if oidc is None:
        fail(f"{url} has no OIDC login configured: use a token (`--token`, BERTH_TOKEN) from its operators")
    issuer, client_id, scopes = oidc.issuer, oidc.client_id, oidc.scopes or ["openid"]
    try:
        discovery = httpx.get(issuer.rstrip("/") + "/.well-known/openid-configuration", timeout=30.0).json()
        authorize, token_endpoint = discovery["authorization_endpoint"], discovery["token_endpoint"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
        fail(f"cannot read the discovery document of {issuer}: {error}")

    verifier = secrets.token_urlsafe(64)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    state = secrets.token_urlsafe(24)
    handler = type("Callback", (_Callback,), {"answer": None, "arrived": threading.Event()})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    redirect = f"http://127.0.0.1:{server.server_port}/callback"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect,
        "scope": " ".join(scopes),
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    link = f"{authorize}?{urlencode(query)}"
    sys.stderr.write(f"Log in at: {link}\n")
    sys.stderr.flush()
    if not no_browser:
        webbrowser.open(link)
    try:
        if not handler.arrived.wait(LOGIN_SECONDS):
            fail(f"no answer from the browser within {LOGIN_SECONDS:g} s; run `berth login` again")
    finally:
        server.shutdown()
        server.server_close()
    answer = handler.answer or {}
    if answer.get("state") != state:
        fail("the login answer does not carry this login's state: refused (run `berth login` again)")
    if "error" in answer:
        fail(f"the identity provider refused the login: {answer['error']} {answer.get('error_description', '')}")
    client_secret = client_secret or Settings().oidc_client_secret
    named, auth = client_auth(client_id, client_secret)
    blank = Credentials(
        issuer=issuer,
        client_id=client_id,
        client_secret=client_secret,
        token_endpoint=token_endpoint,
        id_token="",
        expires_at=0.0,
    )
    try:
        exchanged = httpx.post(
            token_endpoint,
            data={
                "grant_type": "authorization_code",
                "code": answer["code"],
                "redirect_uri": redirect,
                "code_verifier": verifier,
                **named,
            },
            auth=auth,
            timeout=30.0,
        )
        exchanged.raise_for_status()
        credentials = from_token_answer(exchanged.json(), blank)
    except (httpx.HTTPError, ValueError) as error:
        fail(f"the identity provider did not give the tokens: {error}")
    except ApiFailure as error:
        fail(str(error))
    path = save(url, credentials)
    claims = id_token_claims(credentials.id_token)
    name = claims.get("email") or claims.get("preferred_username") or claims.get("sub")
    console.print(f"Logged in to {url} as {name} (tokens kept in {path}).", highlight=False)


def whoami(
    api: ApiOption = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="BERTH_TOKEN",
            help="API bearer token; default: your login, else `berth up`'s admin token.",
        ),
    ] = None,
    output: OutputOption = OutputFormat.TEXT,
) -> None:
    """Who the API takes you for: your name in its audit trail, your role and your tenants."""
    with api_client(api, token) as client:
        me = client.whoami().model_dump(mode="json", by_alias=True)
    if is_data(output):
        print_data(me, output)
        return
    tenants = (
        "every tenant" if me["all_tenants"] else ", ".join(f"{t} ({r})" for t, r in me["tenants"].items()) or "none"
    )
    console.print(f"{me['actor']}\n  role:    {me['role']}\n  tenants: {tenants}", highlight=False)
    if me.get("groups"):
        console.print(f"  groups:  {', '.join(me['groups'])}", highlight=False)
    if me.get("expires_at"):
        console.print(f"  expires: {me['expires_at']}", highlight=False)


def logout(api: ApiOption = None) -> None:
    """Forget the tokens `berth login` kept for this API (the provider's own session is the browser's)."""
    url = _api_url(api)
    if url not in load_all():
        console.print(f"Not logged in to {url}.", highlight=False)
        return
    save(url, None)
    console.print(f"Logged out of {url}.", highlight=False)
