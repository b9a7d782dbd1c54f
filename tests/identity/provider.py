"""The test OIDC provider (tests/oidc_provider.py) as a process, and what a person's browser does with it."""

from __future__ import annotations

import base64
import hashlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlparse

import httpx

from devstack.process import stop

CLIENT_ID = "berth-cli"
# The mock authenticates every client at its token endpoint (any secret will do); a native app's client such as
# Google's "installed app" has a secret too, which is not secret. Providers that take public clients need none.
CLIENT_SECRET = "not-a-secret"


@dataclass
class Provider:
    issuer: str

    def discovery(self) -> dict[str, Any]:
        return httpx.get(f"{self.issuer}/.well-known/openid-configuration").json()

    def put_user(self, sub: str, **claims: Any) -> None:
        answer = httpx.put(f"{self.issuer}/users/{quote(sub)}", json=claims)
        assert answer.status_code == 204, answer.text

    def consent(self, authorize_url: str, sub: str) -> str:
        """What the person does in the browser: open the provider's page and authorize as `sub`. The redirect's
        URL (to the client's redirect URI, carrying the code), not followed."""
        page = httpx.get(authorize_url)
        assert page.status_code == 200, page.text
        answer = httpx.post(authorize_url, data={"sub": sub})
        assert answer.status_code in (302, 303), answer.text
        return answer.headers["location"]

    def login(self, sub: str, client_id: str = CLIENT_ID, **claims: Any) -> dict[str, Any]:
        """The authorization-code flow with PKCE for `sub` (put with `claims` first): the token endpoint's answer."""
        if claims:
            self.put_user(sub, **claims)
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        redirect = "http://127.0.0.1:9/callback"  # never fetched: the test reads the code from the redirect itself
        query = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect,
            "scope": "openid email profile",
            "state": "s",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        location = self.consent(f"{self.discovery()['authorization_endpoint']}?{urlencode(query)}", sub)
        code = parse_qs(urlparse(location).query)["code"][0]
        tokens = httpx.post(
            self.discovery()["token_endpoint"],
            auth=(client_id, CLIENT_SECRET),
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect,
                "code_verifier": verifier,
            },
        )
        assert tokens.status_code == 200, tokens.text
        return tokens.json()

    def refresh(self, refresh_token: str, client_id: str = CLIENT_ID) -> dict[str, Any]:
        answer = httpx.post(
            self.discovery()["token_endpoint"],
            auth=(client_id, CLIENT_SECRET),
            data={"grant_type": "refresh_token", "refresh_token": refresh_token},
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def rotate(self) -> str:
        return httpx.post(f"{self.issuer}/test/rotate").json()["kid"]

    def publish(self, public_key: dict[str, Any]) -> None:
        """Another public key in the provider's JWKS, after its own (a JWK with its `alg`)."""
        assert httpx.post(f"{self.issuer}/test/publish", json=public_key).status_code == 200

    def sign(self, **claims: Any) -> str:
        """`claims` signed with the provider's current key: iss, aud, sub, iat and exp default to a good token's."""
        now = int(time.time())
        full = {"iss": self.issuer, "aud": CLIENT_ID, "sub": "someone", "iat": now, "exp": now + 600} | claims
        return httpx.post(f"{self.issuer}/test/sign", json={k: v for k, v in full.items() if v is not None}).json()[
            "token"
        ]


@contextmanager
def running_provider(token_max_age: int = 3600) -> Iterator[Provider]:
    """The provider process on a free loopback port, stopped (and waited for) at the end."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider", "--token-max-age", str(token_max_age)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the test OIDC provider did not start (exit {process.poll()}): {line!r}")
        yield Provider(issuer=f"http://127.0.0.1:{int(line.split()[-1])}")
    finally:
        stop(process)
