"""Who is calling: `Authorization: Bearer <token>`, checked against the hashed tokens in PostgreSQL.

A tenant token sees and acts only on its own tenant's objects; everything else of other tenants is answered as if
it did not exist (404), so a token cannot even probe which allocation ids are taken. Admin tokens act on all.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from api.services import Services, services
from store.tokens import Principal, verify

bearer = HTTPBearer(auto_error=False, description="An admin token or a tenant token (`berth up` prints both).")


async def principal(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    app: Annotated[Services, Depends(services)],
) -> Principal:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthenticated", "send `Authorization: Bearer <token>`", headers=challenge)
    async with app.sessions() as session:
        found = await verify(session, credentials.credentials)
    if found is None:
        raise ApiError(401, "invalid_token", "the bearer token is unknown or revoked", headers=challenge)
    return found


async def admin(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    if not caller.is_admin:
        raise ApiError(403, "forbidden", "this route needs an admin token")
    return caller


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]


def may_see(caller: Principal, tenant: str) -> bool:
    return caller.is_admin or caller.tenant == tenant


def acting_tenant(caller: Principal, named: str | None) -> str:
    """The tenant a request acts for: a tenant token's own (naming another is forbidden); an admin must name one."""
    if caller.is_admin:
        if named is None:
            raise ApiError(
                422,
                "invalid_request",
                "an admin token must name the tenant the allocation is for",
                [{"field": "body.tenant", "message": "is required with an admin token", "type": "missing"}],
            )
        return named
    assert caller.tenant is not None
    if named is not None and named != caller.tenant:
        raise ApiError(403, "forbidden", f"a token of tenant {caller.tenant!r} cannot act for tenant {named!r}")
    return caller.tenant
