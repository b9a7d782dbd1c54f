"""The control plane's own identity at Temporal, where Temporal's authorizer is on (deploy/README.md, "Identity").

Temporal's default JWT claim mapper reads a bearer token's `permissions` claim (`["berth:write"]`: the namespace and
the role) from the issuer's keys. The API, the control worker and the node gateway get such a token from the same
OIDC provider people log in with, by the OAuth 2.0 client-credentials grant (RFC 6749 section 4.4) as a client of
their own, and send it with every call (the SDK's `api_key`: `authorization: Bearer <token>`), fetched again a minute
before it expires. People get `berth:read` through their own groups; only the control plane writes.

    BERTH_TEMPORAL_OIDC_TOKEN_URL       the provider's token endpoint
    BERTH_TEMPORAL_OIDC_CLIENT_ID       the control plane's client
    BERTH_TEMPORAL_OIDC_CLIENT_SECRET   its secret (a Kubernetes Secret, never in a ConfigMap)
    BERTH_TEMPORAL_OIDC_SCOPE           what to ask for, when the provider wants a scope or an audience named
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from config.identity import unverified_claims

log = logging.getLogger("berth.temporal")

AHEAD_SECONDS = 60.0  # a token is replaced this long before it expires
RETRY_SECONDS = 5.0  # after a failed fetch, while the current token is still good


class CredentialsError(RuntimeError):
    """The provider did not give the control plane a token: its answer, in one line."""


class ClientCredentials:
    """A bearer token from the client-credentials grant, kept and replaced before it expires."""

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token_url, self.client_id, self.client_secret, self.scope = token_url, client_id, client_secret, scope
        self._clock = clock
        self._token: str | None = None
        self._expires_at = 0.0

    @property
    def expires_at(self) -> float:
        """When the token held expires (clock seconds); 0 before the first."""
        return self._expires_at

    def fresh(self) -> bool:
        return self._token is not None and self._expires_at - self._clock() > AHEAD_SECONDS

    async def token(self) -> str:
        """The current token, fetched anew when none is held or it expires within a minute."""
        if self._token is None or not self.fresh():
            await self._fetch()
        assert self._token is not None
        return self._token

    async def _fetch(self) -> None:
        data = {"grant_type": "client_credentials"} | ({"scope": self.scope} if self.scope else {})
        try:
            async with httpx.AsyncClient(timeout=30.0) as http:
                answer = await http.post(self.token_url, data=data, auth=(self.client_id, self.client_secret))
        except httpx.HTTPError as error:
            raise CredentialsError(f"cannot reach the token endpoint {self.token_url}: {error}") from error
        if answer.status_code != 200:
            raise CredentialsError(
                f"{self.token_url} refused client {self.client_id}: HTTP {answer.status_code} {answer.text[:200]}"
            )
        body = answer.json()
        token = body.get("access_token")
        if not isinstance(token, str):
            raise CredentialsError(f"{self.token_url} answered without an access_token")
        self._token = token
        self._expires_at = self._clock() + float(body.get("expires_in") or _lifetime(token, self._clock()))

    async def keep_fresh(self, apply: Callable[[str], None]) -> None:
        """Run for the process's life: hand each new token to `apply` (the client's `api_key`) before the old one
        expires. A failed fetch is logged and tried again while the current token still holds."""
        while True:
            wait = max(1.0, self._expires_at - self._clock() - AHEAD_SECONDS)
            await asyncio.sleep(wait)
            try:
                await self._fetch()
            except CredentialsError as error:
                log.warning("could not renew the control plane's Temporal token: %s", error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            assert self._token is not None
            apply(self._token)


def _lifetime(token: str, now: float) -> float:
    """Seconds until a JWT's `exp`, for a provider that leaves `expires_in` out; 300 for anything else."""
    try:
        return float(unverified_claims(token)["exp"]) - now
    except (ValueError, KeyError, TypeError):
        return 300.0
