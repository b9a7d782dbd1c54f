"""Who the caller is (`GET /v1/whoami`, what `berth whoami` prints) and how a person logs in (`GET /v1/auth`, public:
`berth login` reads the issuer and client id from the API it is pointed at, as kubelogin is given them)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from api.auth import Viewer
from api.errors import error_responses
from api.services import Services, services

router = APIRouter(prefix="/v1", tags=["identity"])
App = Annotated[Services, Depends(services)]


class WhoAmI(BaseModel):
    actor: str = Field(description="How the audit trail names the caller.")
    kind: Literal["token", "person"]
    role: str = Field(description="The highest role held: viewer, member, operator or admin.")
    tenants: dict[str, str] = Field(
        description="tenant -> role; empty for an operator or admin, who hold every tenant."
    )
    all_tenants: bool = Field(description="Whether the caller holds every tenant (an operator or admin).")
    groups: list[str] = Field(description="A person's groups, as the identity provider said.")
    token_id: int | None = None
    expires_at: datetime | None = None


class OidcLogin(BaseModel):
    issuer: str
    client_id: str
    scopes: list[str]


class AuthConfig(BaseModel):
    oidc: OidcLogin | None = Field(description="Where people log in; null: this API takes Berth tokens only.")


@router.get("/whoami", response_model=WhoAmI, responses=error_responses(401, 403))
async def whoami(caller: Viewer) -> WhoAmI:
    """The caller as the API sees it: its name in the audit trail, its role and the tenants it belongs to."""
    return WhoAmI(
        actor=caller.actor,
        kind=caller.kind,
        role=caller.role,
        tenants=dict(sorted(caller.tenants.items())),
        all_tenants=caller.sees_all,
        groups=list(caller.groups),
        token_id=caller.token_id,
        expires_at=caller.expires_at,
    )


@router.get("/auth", response_model=AuthConfig)
async def auth_config(app: App) -> AuthConfig:
    """Public: the OIDC issuer and client people log in with (`berth login`), or null."""
    if app.oidc is None:
        return AuthConfig(oidc=None)
    settings = app.oidc.settings
    groups = ["groups"] if settings.groups_claim == "groups" else []
    return AuthConfig(
        oidc=OidcLogin(
            issuer=settings.issuer, client_id=settings.client_id, scopes=["openid", "email", "profile", *groups]
        )
    )
