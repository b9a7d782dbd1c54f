"""API bearer tokens: created once, stored only as SHA-256 digests, verified by digest.

The plaintext is returned to whoever creates the token and never stored, so a copy of the database lets no one call
the API. Tokens are long random strings, so a plain (unsalted) digest is enough: there is nothing to brute-force.
A token is an admin token (acts on everything), a tenant token (acts only on that tenant's objects) or a node token
(a node agent's: it may only report for its own node).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import ARRAY, Integer, any_, func, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import ApiTokenRow, NodeRow, TenantRow

Role = Literal["admin", "tenant", "node"]
TOKEN_PREFIX = "berth_"  # makes a leaked token recognisable to secret scanners and to people
TOKEN_LENGTH = len(TOKEN_PREFIX) + 43  # secrets.token_urlsafe(32)


class Principal(BaseModel):
    """Who is calling: what a verified token stands for."""

    model_config = ConfigDict(frozen=True)

    token_id: int
    role: Role
    tenant: str | None  # set exactly for tenant tokens
    node: str | None = None  # set exactly for node tokens

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


async def create_token(
    session: AsyncSession, role: Role, tenant: str | None = None, label: str | None = None, node: str | None = None
) -> str:
    """Store a new token and return its plaintext, the only time it is ever available. The caller commits."""
    if (role == "tenant") != (tenant is not None) or (role == "node") != (node is not None):
        raise ValueError("an admin token names no tenant or node; a tenant token one tenant; a node token one node")
    if tenant is not None and await session.get(TenantRow, tenant) is None:
        raise ValueError(f"unknown tenant {tenant!r}: apply a fleet file that declares it first")
    if node is not None and await session.get(NodeRow, node) is None:
        raise ValueError(f"unknown node {node!r}: apply a fleet file that declares it first")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiTokenRow(token_sha256=digest(token), role=role, tenant=tenant, node=node, label=label))
    await session.flush()
    return token


async def verify(session: AsyncSession, token: str) -> Principal | None:
    """The principal a token stands for, or None when it is unknown or revoked."""
    row = await session.scalar(
        select(ApiTokenRow).where(ApiTokenRow.token_sha256 == digest(token), ApiTokenRow.revoked_at.is_(None))
    )
    if row is None:
        return None
    return Principal(token_id=row.id, role=row.role, tenant=row.tenant, node=row.node)  # type: ignore[arg-type]


async def ensure_tenant_tokens(session: AsyncSession) -> dict[str, str]:
    """Give every tenant without a live token one; return {tenant: plaintext} for the tokens created now.

    Tenants that already hold a token get nothing new: their plaintext is not recoverable, and issuing a second
    one on every `berth apply` would pile up credentials no one asked for."""
    holders = select(ApiTokenRow.tenant).where(ApiTokenRow.tenant.is_not(None), ApiTokenRow.revoked_at.is_(None))
    tenants = (await session.scalars(select(TenantRow.name).where(TenantRow.name.not_in(holders)))).all()
    return {
        tenant: await create_token(session, "tenant", tenant, label="created for the fleet's tenant")
        for tenant in sorted(tenants)
    }


DEV_STACK_LABEL = "berth up"


async def rotate_dev_stack_tokens(session: AsyncSession) -> tuple[str, dict[str, str]]:
    """Fresh tokens for a `berth up` session: one admin token and one per tenant, labelled so the next `berth up`
    revokes them (plaintext exists only in that session's context.json). The caller commits."""
    await session.execute(
        update(ApiTokenRow)
        .where(ApiTokenRow.label == DEV_STACK_LABEL, ApiTokenRow.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    admin = await create_token(session, "admin", label=DEV_STACK_LABEL)
    tenants = (await session.scalars(select(TenantRow.name).order_by(TenantRow.name))).all()
    return admin, {tenant: await create_token(session, "tenant", tenant, label=DEV_STACK_LABEL) for tenant in tenants}


async def revoke_tokens(
    session: AsyncSession, *, node: str | None = None, token_id: int | None = None, keep: int | None = None
) -> list[int]:
    """Revoke a node's live tokens (but `keep`, a rotation's new one), or one token by id; the ids revoked. The
    caller commits. Every API process and node gateway refuses them within a few seconds of the commit
    (store/token_cache.py)."""
    if (node is None) == (token_id is None):
        raise ValueError("revoke a node's tokens or one token by id")
    where = ApiTokenRow.node == node if node is not None else ApiTokenRow.id == token_id
    revoked = await session.scalars(
        update(ApiTokenRow)
        .where(where, ApiTokenRow.revoked_at.is_(None), ApiTokenRow.id != (keep if keep is not None else -1))
        .values(revoked_at=func.now())
        .returning(ApiTokenRow.id)
    )
    return sorted(revoked.all())


async def still_live(session: AsyncSession, token_ids: set[int]) -> set[int]:
    """Which of `token_ids` are still live: neither revoked nor deleted (a node removed from the fleet takes its
    tokens with it). What a token cache must keep; everything else it must forget."""
    if not token_ids:
        return set()
    ids = literal(sorted(token_ids), ARRAY(Integer))  # one array parameter, however many agents are cached
    rows = await session.scalars(
        select(ApiTokenRow.id).where(ApiTokenRow.id == any_(ids), ApiTokenRow.revoked_at.is_(None))
    )
    return set(rows.all())


def plausible(token: str) -> bool:
    """Whether `token` could be one `create_token` made: anything else is refused without a database query."""
    return token.startswith(TOKEN_PREFIX) and len(token) <= 2 * TOKEN_LENGTH and token.isascii()
