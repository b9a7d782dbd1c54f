"""Who the caller is (`GET /v1/whoami`, what `berth whoami` prints) and how a person logs in (`GET /v1/auth`, public:
`berth login` reads the issuer and client id from the API it is pointed at, as kubelogin is given them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from api.auth import Viewer
from api.errors import error_responses
from api.services import Services, services
from contracts.http import AuthConfig, OidcLogin, WhoAmI

router = APIRouter(prefix="/v1", tags=["identity"])
App = Annotated[Services, Depends(services)]


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
