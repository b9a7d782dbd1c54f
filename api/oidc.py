"""People's identities: OIDC ID tokens from the company's provider, verified as Kubernetes' OIDC authenticator does.

A person logs in with `berth login` (cli/login.py) and sends the provider's ID token as the bearer. This module
verifies it, never with hand-written cryptography (joserfc):

    discovery  `<issuer>/.well-known/openid-configuration`, whose `issuer` must be the configured one exactly
    keys       its `jwks_uri`, cached for `jwks_max_age_seconds` at most, so a key the provider withdrew stops
               working; a token signed with a key id not in the cache fetches the set again (no more than once per
               `jwks_refresh_seconds`), so the provider can rotate its keys with no restart
    signature  an asymmetric algorithm the provider announces (`alg: none`, HMAC, and an HS256 token "signed" with
               the public key are refused), with the key the token's `kid` names, else each key of the algorithm's
               type
    claims     `iss` is the issuer, `aud` holds the client id, `exp` is ahead and `nbf`/`iat` not ahead (with
               `leeway_seconds` for clock skew)
    mapping    the username claim names the actor (with `email`, only an address the provider verified); the
               groups claim gives roles: each group named in `roles` grants `viewer:<tenant>`, `member:<tenant>`,
               `operator` or `admin`, the highest of each wins; a person in no mapped group is a viewer of nothing,
               who sees nothing

Each refusal is a 401 with a code a client can act on (`token_expired`: log in again or refresh); a token that cannot
even be read is `invalid_token`, never a 500. A provider that cannot be read is a 503 with `Retry-After`.
docs/identity.md lists the codes and the settings.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from joserfc import jws, jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    InvalidKeyCurveError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry

from config.identity import OidcSettings
from store.tokens import RANK, PersonRole, Principal

# Asymmetric only: a verifier that accepted HMAC would accept a token "signed" with the provider's public key.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


# What reading a token that anyone may have written can raise: joserfc's own refusals; ValueError for text that is not
# base64 (binascii.Error), bytes that are not UTF-8 (UnicodeDecodeError), text that is not JSON, or a date past the
# year 9999; RecursionError for JSON nested deeper than the interpreter's stack; OverflowError for a number no date
# or float holds (a signed `exp` of 10**20); TypeError for a claim of a type no check expected.
UNREADABLE = (JoseError, ValueError, TypeError, RecursionError, OverflowError)


def _kids(keys: KeySet) -> set[str]:
    return {key.kid for key in keys.keys if key.kid}


def _decode(token: str, keys: KeySet, algorithm: str, allowed: list[str]) -> dict[str, Any]:
    """The claims of a token whose signature verifies with one of `keys`: the one its `kid` names, else each key of
    the type its algorithm needs. A provider may publish an RSA and an EC key side by side, and a token that names
    no key says which kind it was signed with only by its `alg`: an RSA key is no answer for an ES256 token, so it is
    skipped, not taken as the token's refusal (nor is an EC key of another curve)."""
    if jws.extract_compact(token.encode()).protected.get("kid"):
        candidates = [keys]
    else:
        kind = JWSRegistry.algorithms[algorithm].key_type
        candidates = [KeySet([key]) for key in keys.keys if key.key_type == kind]
    for candidate in candidates:
        try:
            return jwt.decode(token, candidate, algorithms=allowed).claims
        except (BadSignatureError, InvalidKeyCurveError):
            continue
        except JoseError as error:
            raise OidcRefused("invalid_token", f"the token cannot be verified: {error.description or error}") from error
    raise OidcRefused("invalid_signature", "the token's signature does not verify with the issuer's keys")


class OidcRefused(Exception):
    """A bearer that is not a valid ID token of the configured issuer; `code` says which check failed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class OidcUnavailable(Exception):
    """The provider's discovery document or keys could not be read (a 503: the token may well be good);
    `retry_after` is how many seconds until the verifier asks the provider again, the 503's `Retry-After`."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OidcVerifier:
    """Verifies ID tokens of one issuer; one per API process, its keys shared by every request."""

    def __init__(
        self,
        settings: OidcSettings,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._client = client
        self._clock = clock
        self._discovery: dict[str, Any] | None = None
        self._keys: KeySet | None = None
        self._fetched_at = float("-inf")
        self._failed_at = float("-inf")
        self._failure = ""
        self._lock = asyncio.Lock()

    def _unavailable(self, message: str) -> OidcUnavailable:
        """The provider could not be read: remembered, so that `_get` answers from this failure, without asking,
        until `jwks_refresh_seconds` have passed. Each request would otherwise wait out its own timeout, one after
        another behind the key lock, and a provider that is struggling would get every request's retry."""
        self._failed_at = self._clock()
        self._failure = message
        return OidcUnavailable(message, self._retry_after())

    def _retry_after(self) -> int:
        """Whole seconds until the provider is asked again (at least 1, as a `Retry-After` of 0 invites a loop)."""
        left = self.settings.jwks_refresh_seconds - (self._clock() - self._failed_at)
        return max(1, math.ceil(left))

    async def _get(self, url: str) -> dict[str, Any]:
        if self._clock() - self._failed_at < self.settings.jwks_refresh_seconds:
            raise OidcUnavailable(self._failure, self._retry_after())
        try:
            if self._client is not None:
                answer = await self._client.get(url)
            else:
                async with httpx.AsyncClient(timeout=10.0) as client:
                    answer = await client.get(url)
            answer.raise_for_status()
            document = answer.json()
        except (httpx.HTTPError, ValueError) as error:
            raise self._unavailable(f"the OIDC provider did not answer {url}: {error}") from error
        if not isinstance(document, dict):
            raise self._unavailable(f"the OIDC provider's {url} is not a JSON object")
        return document

    async def discovery(self) -> dict[str, Any]:
        """The provider's discovery document, read once; its `issuer` must be the configured issuer exactly."""
        if self._discovery is None:
            url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
            document = await self._get(url)
            if document.get("issuer") != self.settings.issuer:
                raise self._unavailable(
                    f"the discovery document at {url} names issuer {document.get('issuer')!r}, not "
                    f"{self.settings.issuer!r}: configure the issuer exactly as the provider names itself"
                )
            if not isinstance(document.get("jwks_uri"), str):
                raise self._unavailable(f"the discovery document at {url} has no jwks_uri")
            self._discovery = document
        return self._discovery

    async def _key_set(self, kid: str | None, *, rotated: bool = False) -> KeySet:
        """The cached keys, fetched again when they are `jwks_max_age_seconds` old, so that a key the provider
        withdrew (after a leak, say) stops verifying tokens within that time; and sooner when a token names a key
        id they lack, or (`rotated`) when a token that names none does not verify with them: the provider rotated
        its keys. Those early fetches happen at most once per `jwks_refresh_seconds`, so that made-up tokens cannot
        make the API hammer the provider.

        Keys past their maximum age are never used: when they cannot be fetched again, the answer is
        `OidcUnavailable` (a 503), not the old keys. A grace with stale keys would stretch the time a withdrawn key
        keeps working by however long the provider stays unreachable, and whoever can make it unreachable from here
        would choose that time."""
        async with self._lock:
            age = self._clock() - self._fetched_at
            known = self._keys is not None and not rotated and (kid is None or kid in _kids(self._keys))
            expired = age >= self.settings.jwks_max_age_seconds
            if self._keys is None or expired or (not known and age >= self.settings.jwks_refresh_seconds):
                document = await self._get((await self.discovery())["jwks_uri"])
                try:
                    self._keys = KeySet.import_key_set(document)  # type: ignore[arg-type]
                except (JoseError, ValueError, TypeError, KeyError) as error:
                    raise self._unavailable(f"the provider's keys cannot be read: {error}") from error
                self._fetched_at = self._clock()
            return self._keys

    async def verify(self, token: str) -> Principal:
        """The person an ID token stands for; `OidcRefused` with the failed check's code otherwise.

        Anyone can send any bytes as a token, so whatever reading them raises is the sender's mistake, a 401
        `invalid_token`, never a 500 (see `UNREADABLE`). The provider's own answers are read under their own
        guard, in `_get` and `_key_set`, and a provider that cannot be read stays `OidcUnavailable`."""
        try:
            return await self._verify(token)
        except UNREADABLE as error:
            reason = getattr(error, "description", None) or str(error) or type(error).__name__
            raise OidcRefused("invalid_token", f"the token cannot be read: {reason}") from error

    async def _verify(self, token: str) -> Principal:
        compact = jws.extract_compact(token.encode())
        header, unverified = compact.protected, json.loads(compact.payload)
        if not isinstance(unverified, dict):
            raise OidcRefused("invalid_token", "the token's payload is not a JSON object")
        issuer = unverified.get("iss")
        if issuer != self.settings.issuer:  # told first, as it is the likeliest mistake; the token is refused anyway
            raise OidcRefused("wrong_issuer", f"the token was issued by {issuer!r}, not {self.settings.issuer!r}")
        algorithm = header.get("alg")
        announced = (await self.discovery()).get("id_token_signing_alg_values_supported") or ["RS256"]
        allowed = [a for a in announced if a in ASYMMETRIC]
        if algorithm not in allowed:
            raise OidcRefused(
                "unsupported_algorithm",
                f"tokens signed with {algorithm!r} are refused: the issuer signs with {', '.join(allowed) or 'none'}",
            )
        kid = header.get("kid") if isinstance(header.get("kid"), str) else None
        keys = await self._key_set(kid)
        if kid is not None and kid not in _kids(keys):
            raise OidcRefused("unknown_key", f"the token is signed with key {kid!r}, which the issuer does not publish")
        try:
            decoded = _decode(token, keys, algorithm, allowed)
        except OidcRefused as refused:
            if kid is not None or refused.code != "invalid_signature":
                raise
            rotated = await self._key_set(None, rotated=True)  # no kid: the keys may be new
            decoded = _decode(token, rotated, algorithm, allowed)
        self._check_claims(decoded)
        return self.principal(decoded)

    def _check_claims(self, claims: dict[str, Any]) -> None:
        issuer = claims.get("iss")
        if issuer != self.settings.issuer:
            raise OidcRefused("wrong_issuer", f"the token was issued by {issuer!r}, not {self.settings.issuer!r}")
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.settings.client_id not in audiences:
            raise OidcRefused("wrong_audience", f"the token is for {audience!r}, not for {self.settings.client_id!r}")
        registry = jwt.JWTClaimsRegistry(leeway=self.settings.leeway_seconds, exp={"essential": True})
        try:
            registry.validate(claims)
        except ExpiredTokenError as error:
            raise OidcRefused("token_expired", "the token has expired: log in again (`berth login`)") from error
        except MissingClaimError as error:
            raise OidcRefused("invalid_token", f"the token lacks a claim it must have: {error.description}") from error
        except InvalidClaimError as error:
            if error.claim == "nbf":
                raise OidcRefused("token_not_yet_valid", "the token is not valid yet (nbf is ahead)") from error
            raise OidcRefused("invalid_token", f"claim {error.claim!r}: {error.description}") from error
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise OidcRefused("invalid_token", "the token names no subject (sub)")

    def principal(self, claims: dict[str, Any]) -> Principal:
        """The person, with the roles their groups grant.

        An address the provider has not verified names no one: at a provider that lets anyone sign up, Mallory could
        register alice@example.com and act as Alice. So, as Kubernetes' OIDC authenticator does, with the username
        claim `email` a token whose `email_verified` is there and not `true` is refused; one without it is taken
        (many providers verify every address and never say so)."""
        if self.settings.username_claim == "email" and claims.get("email_verified", True) is not True:
            raise OidcRefused(
                "email_not_verified",
                f"the provider has not verified the address {claims.get('email')!r} (email_verified is "
                f"{claims['email_verified']!r}): verify it at the provider, then log in again",
            )
        name = claims.get(self.settings.username_claim)
        actor = name if isinstance(name, str) and name else str(claims["sub"])
        raw = claims.get(self.settings.groups_claim) or []
        groups = tuple(sorted(g for g in (raw if isinstance(raw, list) else [raw]) if isinstance(g, str)))
        fleet_role: str | None = None
        tenants: dict[str, PersonRole] = {}
        for group in groups:
            for grant in self.settings.roles.get(group, []):
                role, _, tenant = grant.partition(":")
                if tenant:
                    if RANK[role] > RANK.get(tenants.get(tenant, ""), 0):
                        tenants[tenant] = role  # type: ignore[assignment]
                elif RANK[role] > RANK.get(fleet_role or "", 0):
                    fleet_role = role
        top = max([fleet_role or "", *tenants.values()], key=lambda r: RANK.get(r, 0)) or "viewer"
        expires = claims.get("exp")
        return Principal(
            actor=actor,
            kind="person",
            expires_at=datetime.fromtimestamp(expires, UTC) if isinstance(expires, int | float) else None,
            role=fleet_role or top,  # type: ignore[arg-type]
            tenants={} if fleet_role else tenants,
            groups=groups,
        )
