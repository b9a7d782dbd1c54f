"""Who is calling, and what that caller's role lets it do: `Authorization: Bearer <token>`.

The bearer is either a Berth token (`berth_...`: a service account or a node agent, checked against the hashed
tokens in PostgreSQL) or a person's ID token from the configured OIDC provider (api/oidc.py). Both become a
`Principal` with a role (store/tokens.py says what each role may do).

Each route declares the least role it needs with one of the dependencies below (`Viewer`, `Member`, `Operator`,
`Admin`, `Reporter`); a route with none is public (health, metrics, how to log in). tests/api/test_route_roles.py
builds the table of every route against every role from the app itself, so a route added without a decision fails.

Within a route, tenancy decides: what belongs to a tenant the caller has no part in is answered as if it did not
exist (404), so no one can probe which ids are taken; a viewer of a tenant who tries to change its objects gets 403.

Refusals: 401 when the caller is not known (`unauthenticated`, `invalid_token`, `token_expired`, `token_revoked`,
and for ID tokens `token_not_yet_valid`, `wrong_issuer`, `wrong_audience`, `unsupported_algorithm`,
`invalid_signature`, `unknown_key`, `email_not_verified`); 403 when it is known but may not (`forbidden`;
`node_token` for a node agent's token anywhere but its own node's report, `not_a_node` for a person's or a service
account's token on the node route), as RFC 6750 tells an invalid token (401) from an insufficient one (403).

Node tokens are checked through `store/token_cache.py`: ten thousand agents heartbeating must not cost ten thousand
token look-ups a minute, yet a revoked node token stops working within seconds (the cache sweeps revocations).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from api.oidc import OidcRefused, OidcUnavailable
from api.services import Services, services
from store.tokens import Principal, TokenRefused, at_least, plausible

bearer = HTTPBearer(
    auto_error=False,
    description="A Berth token (`berth tokens create`) or a person's ID token (`berth login`).",
)

# Where api/body_limit.py keeps the principal it verified before the body was read (the request's state).
PRINCIPAL = "principal"
CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def verified(token: str | None, app: Services) -> Principal:
    """Whom a bearer stands for; 401 with the reason when no one, 503 when the identity provider cannot tell.

    Every refusal is counted by its code (`berth_auth_refusals_total`): the request log records only callers who
    proved who they are (docs/identity.md says why), so the counter is what shows a flood of forged tokens."""
    try:
        return await _identify(token, app)
    except ApiError as refusal:
        app.metrics.auth_refusals.labels(refusal.code).inc()
        raise


async def _identify(token: str | None, app: Services) -> Principal:
    if token is None:
        raise ApiError(401, "unauthenticated", "send `Authorization: Bearer <token>`", headers=CHALLENGE)
    if plausible(token):
        found = await app.tokens.check(app.sessions, token)
        if isinstance(found, TokenRefused):
            raise ApiError(401, found.code, found.message, headers=CHALLENGE)
        return found
    if token.count(".") == 2:
        if app.oidc is None:
            raise ApiError(
                401, "invalid_token", "this API has no OIDC issuer configured: use a Berth token", headers=CHALLENGE
            )
        try:
            return await app.oidc.verify(token)
        except OidcRefused as refused:
            raise ApiError(401, refused.code, refused.message, headers=CHALLENGE) from refused
        except OidcUnavailable as error:
            retry = {"Retry-After": str(error.retry_after)}  # when the verifier will ask the provider again
            raise ApiError(503, "identity_provider_unavailable", str(error), headers=retry) from error
    raise ApiError(401, "invalid_token", "the bearer is neither a Berth token nor an ID token (JWT)", headers=CHALLENGE)


async def _caller(request: Request, credentials: HTTPAuthorizationCredentials | None, app: Services) -> Principal:
    """The principal api/body_limit.py verified before reading the body, else the token checked now."""
    found = getattr(request.state, PRINCIPAL, None)
    if not isinstance(found, Principal):
        found = await verified(credentials.credentials if credentials is not None else None, app)
        setattr(request.state, PRINCIPAL, found)  # the request log names it (api/request_log.py)
    return found


RoleCheck = Callable[..., Awaitable[Principal]]


def needs(role: str) -> RoleCheck:
    """The dependency of a route that needs at least `role` (`node`: a node agent's report)."""

    async def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        app: Annotated[Services, Depends(services)],
    ) -> Principal:
        found = await _caller(request, credentials, app)
        if role == "node":
            if found.role != "node" and not found.is_admin:
                raise ApiError(403, "not_a_node", "node reports need a node token (or an admin's)")
            return found
        if found.role == "node":
            raise ApiError(403, "node_token", "a node token can only report for its own node")
        if not at_least(found.role, role):
            raise ApiError(403, "forbidden", f"this needs the {role} role; {found.actor} is a {found.role}")
        return found

    check.role = role  # type: ignore[attr-defined]  # read by the route table (tests/api/test_route_roles.py)
    return check


Viewer = Annotated[Principal, Depends(needs("viewer"))]
Member = Annotated[Principal, Depends(needs("member"))]
Operator = Annotated[Principal, Depends(needs("operator"))]
Admin = Annotated[Principal, Depends(needs("admin"))]
Reporter = Annotated[Principal, Depends(needs("node"))]


def require_act(caller: Principal, tenant: str) -> None:
    """403 for a caller that may see `tenant`'s object but not change it (a viewer there)."""
    if not caller.may_act(tenant):
        raise ApiError(
            403,
            "forbidden",
            f"{caller.actor} is a {caller.role_in(tenant)} of tenant {tenant!r}: only a member may change its objects",
        )


def acting_tenant(caller: Principal, named: str | None, *, act: bool = True) -> str:
    """The tenant a request is for: the one named, which the caller must belong to (and, with `act`, be a member
    of); else the caller's only tenant. An operator or admin, or a person in several tenants, must name one."""
    if named is None:
        if caller.only_tenant is not None:
            named = caller.only_tenant
        else:
            why = (
                "an operator or admin"
                if caller.sees_all
                else f"{caller.actor}, who belongs to {len(caller.tenants)} tenants,"
            )
            raise ApiError(
                422,
                "invalid_request",
                f"{why} must name the tenant it acts for (`tenant`)",
                [{"field": "body.tenant", "message": "is required for this caller", "type": "missing"}],
            )
    if not caller.may_see(named):
        raise ApiError(403, "forbidden", f"{caller.actor} cannot act for tenant {named!r}")
    if act:
        require_act(caller, named)
    return named
