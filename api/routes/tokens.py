"""`/v1/tokens` (admin): service accounts' and node agents' bearer tokens, what `berth tokens` manages.

    POST   /v1/tokens                    create one (role; tenant, node; label; expires_in): 201, its plaintext once
    GET    /v1/tokens?all=false          list them (never a plaintext: only digests are kept)
    DELETE /v1/tokens/{token_id}         revoke one: 404 when no live token has that id
    DELETE /v1/nodes/{node}/tokens?keep= revoke a node's live tokens, but `keep` (a rotation's new one)

The rules are the store's (store/tokens.py): a viewer or member names one tenant, an operator or admin none, a node
token one node; a tenant or node the fleet does not have is a 422 (`unknown_tenant`, `unknown_node`) naming the
field. A revoked token is refused everywhere within seconds (store/token_cache.py). Every call is recorded in the
request log under the caller (api/request_log.py), never with a plaintext: the path and status only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query

from api.auth import Admin
from api.errors import ApiError, error_responses
from api.services import Services, services
from contracts.http import TokenCreate, TokenCreated, TokenList, TokensRevoked, TokenView
from contracts.manifest import Name
from store import tokens as store

router = APIRouter(prefix="/v1", tags=["admin"])
App = Annotated[Services, Depends(services)]
TokenId = Annotated[int, Path(ge=1, le=2**31 - 1, description="The token's id, as `GET /v1/tokens` lists it.")]


@router.post("/tokens", status_code=201, response_model=TokenCreated, responses=error_responses(401, 403, 422))
async def create_token(body: Annotated[TokenCreate, Body()], caller: Admin, app: App) -> TokenCreated:
    """Create a service account's token or a node agent's; the answer holds its plaintext, the only time it is
    shown. People do not need tokens: they log in."""
    role = body.chosen_role()
    expires_at = datetime.now(UTC) + timedelta(seconds=body.expires_in) if body.expires_in is not None else None
    async with app.sessions.begin() as session:
        try:
            token = await store.create_token(session, role, body.tenant, body.label, body.node, expires_at)
        except store.UnknownScope as error:
            problem = {"field": f"body.{error.kind}", "message": str(error), "type": f"unknown_{error.kind}"}
            raise ApiError(422, f"unknown_{error.kind}", str(error), [problem]) from error
        created = await store.verify(session, token)
    assert created is not None and created.token_id is not None  # made in this very transaction
    return TokenCreated(
        id=created.token_id,
        role=role,
        tenant=body.tenant,
        node=body.node,
        label=body.label,
        expires_at=expires_at,
        token=token,
    )


@router.get("/tokens", response_model=TokenList, responses=error_responses(401, 403, 422))
async def list_tokens(
    caller: Admin,
    app: App,
    all_: Annotated[bool, Query(alias="all", description="Revoked and expired tokens too.")] = False,
) -> TokenList:
    """Every live token (with `all`, every one): id, role, tenant or node, label, and when it was made, expires or
    was revoked."""
    async with app.sessions() as session:
        rows = await store.listed(session, include_ended=all_)
    return TokenList(tokens=[TokenView.model_validate(row, from_attributes=True) for row in rows])


@router.delete("/tokens/{token_id}", response_model=TokensRevoked, responses=error_responses(401, 403, 404, 422))
async def revoke_token(token_id: TokenId, caller: Admin, app: App) -> TokensRevoked:
    """Revoke one token: refused everywhere within seconds. 404 when no live token has this id."""
    async with app.sessions.begin() as session:
        revoked = await store.revoke_tokens(session, token_id=token_id)
    if not revoked:
        raise ApiError(404, "not_found", f"no live token with id {token_id}", {"kind": "token", "name": str(token_id)})
    return TokensRevoked(revoked=revoked)


@router.delete("/nodes/{node}/tokens", response_model=TokensRevoked, responses=error_responses(401, 403, 422))
async def revoke_node_tokens(
    node: Annotated[Name, Path(description="The node whose tokens are revoked.")],
    caller: Admin,
    app: App,
    keep: Annotated[
        int | None,
        Query(ge=1, le=2**31 - 1, description="A token of the node left live: a rotation's new one."),
    ] = None,
) -> TokensRevoked:
    """Revoke every live token of a node but `keep` (what `berth tokens rotate` does once the agent holds its new
    token). The ids revoked, none when the node had no other live token."""
    async with app.sessions.begin() as session:
        revoked = await store.revoke_tokens(session, node=node, keep=keep)
    return TokensRevoked(revoked=revoked)
