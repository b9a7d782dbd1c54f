"""Who is calling: `Authorization: Bearer <token>`, checked against the hashed tokens in PostgreSQL.

A tenant token sees and acts only on its own tenant's objects; everything else of other tenants is answered as if
it did not exist (404), so a token cannot even probe which allocation ids are taken. Admin tokens act on all. A node
token (a node agent's) is good for one thing only: reporting for its own node (`reporter`); every other route
refuses it.

Node tokens are checked through `store/token_cache.py`: ten thousand agents heartbeating must not cost ten thousand
token look-ups a minute, yet a revoked node token stops working within seconds (the cache sweeps revocations).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from api.services import Services, services
from store.tokens import Principal

bearer = HTTPBearer(auto_error=False, description="An admin token or a tenant token (`berth up` prints both).")


# Where api/body_limit.py keeps the principal it verified before the body was read (the request's state).
PRINCIPAL = "principal"


async def verified(token: str | None, app: Services) -> Principal:
    """Whom a bearer token stands for; 401 when there is none or it is unknown or revoked."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if token is None:
        raise ApiError(401, "unauthenticated", "send `Authorization: Bearer <token>`", headers=challenge)
    found = await app.tokens.principal(app.sessions, token)
    if found is None:
        raise ApiError(401, "invalid_token", "the bearer token is unknown or revoked", headers=challenge)
    return found


async def _caller(request: Request, credentials: HTTPAuthorizationCredentials | None, app: Services) -> Principal:
    """The principal api/body_limit.py verified before reading the body, else the token checked now."""
    found = getattr(request.state, PRINCIPAL, None)
    if isinstance(found, Principal):
        return found
    return await verified(credentials.credentials if credentials is not None else None, app)


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    app: Annotated[Services, Depends(services)],
) -> Principal:
    found = await _caller(request, credentials, app)
    if found.role == "node":
        raise ApiError(403, "forbidden", "a node token can only report for its own node")
    return found


async def reporter(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    app: Annotated[Services, Depends(services)],
) -> Principal:
    """A node agent's token, or an admin's (an operator reporting by hand)."""
    found = await _caller(request, credentials, app)
    if found.role == "tenant":
        raise ApiError(403, "forbidden", "node reports need a node token or an admin token")
    return found


async def admin(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    if not caller.is_admin:
        raise ApiError(403, "forbidden", "this route needs an admin token")
    return caller


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
Reporter = Annotated[Principal, Depends(reporter)]


def may_see(caller: Principal, tenant: str) -> bool:
    return caller.is_admin or caller.tenant == tenant


def acting_tenant(caller: Principal, named: str | None) -> str:
    """The tenant a request acts for: a tenant token's own (naming another is forbidden); an admin must name one."""
    if caller.is_admin:
        if named is None:
            raise ApiError(
                422,
                "invalid_request",
                "an admin token must name the tenant it acts for (`tenant`)",
                [{"field": "body.tenant", "message": "is required with an admin token", "type": "missing"}],
            )
        return named
    assert caller.tenant is not None
    if named is not None and named != caller.tenant:
        raise ApiError(403, "forbidden", f"a token of tenant {caller.tenant!r} cannot act for tenant {named!r}")
    return caller.tenant
