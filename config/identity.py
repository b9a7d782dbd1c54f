"""What the API trusts about people: the OIDC issuer, the client whose ID tokens it accepts, and which groups hold
which roles (api/oidc.py verifies; store/tokens.py says what each role may do)."""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import BaseModel, Field, field_validator

GRANT_ROLES = ("viewer", "member", "operator", "admin")


class OidcSettings(BaseModel):
    """What the API trusts (BERTH_OIDC_* settings; deploy/README.md shows them for each provider)."""

    issuer: str = Field(description="The issuer URL, exactly as its discovery document and its tokens say it.")
    client_id: str = Field(description="The client id `berth login` uses: the `aud` an ID token must carry.")
    username_claim: str = Field(default="email", description="The claim that names the person (else `sub`).")
    groups_claim: str = Field(default="groups", description="The claim that lists the person's groups.")
    roles: dict[str, list[str]] = Field(
        default_factory=dict,
        description="group -> grants: `viewer:<tenant>`, `member:<tenant>`, `operator`, `admin`.",
    )
    leeway_seconds: int = Field(default=60, ge=0, le=300, description="Clock skew allowed on exp, nbf and iat.")
    jwks_refresh_seconds: float = Field(
        default=10.0,
        ge=0,
        description="The least time between two fetches of the keys for a token they do not verify, and after a "
        "failed fetch (the 503's Retry-After).",
    )
    jwks_max_age_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How long the keys are trusted before they are fetched again, so a withdrawn key stops working.",
    )

    @field_validator("roles")
    @classmethod
    def _grants_are_known(cls, roles: dict[str, list[str]]) -> dict[str, list[str]]:
        for group, grants in roles.items():
            for grant in grants:
                role, _, tenant = grant.partition(":")
                if role not in GRANT_ROLES or (role in ("viewer", "member")) != bool(tenant):
                    raise ValueError(
                        f"group {group!r}: {grant!r} is not a grant: use viewer:<tenant>, member:<tenant>, operator "
                        "or admin"
                    )
        return roles


def unverified_claims(token: str) -> dict[str, Any]:
    """A JWT's claims, read without verifying it: for its holder (`exp`, to renew it in time; a name to greet), never
    for deciding anything about it (api/oidc.py verifies). ValueError for anything that is not a JWT."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, UnicodeError) as error:
        raise ValueError(f"not a JWT: {error}") from error
    if not isinstance(claims, dict):
        raise ValueError("not a JWT: its payload is not a JSON object")
    return claims
