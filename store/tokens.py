"""API bearer tokens: created once, stored only as SHA-256 digests, verified by digest; and who a caller is.

The plaintext is returned to whoever creates the token and never stored, so a copy of the database lets no one call
the API. Tokens are long random strings, so a plain (unsalted) digest is enough: there is nothing to brute-force.

A static token is a service account (automation: CI, a scheduler, a dashboard) with one role, and for `viewer` and
`member` one tenant; it may have an expiry. People are not given tokens: they log in with the company's OIDC
provider (api/oidc.py), and their groups give them roles per tenant. Both end up as the same `Principal`:

    viewer    reads its tenants' allocations, reservations, queues, capacity and usage
    member    also creates, extends, cancels and releases its tenants' allocations and reservations
    operator  every tenant as a member, plus the nodes (cordon, drain, repair), retries and the audit
    admin     everything: the fleet, ModelDeployments, tokens
    node      a node agent's: it may only report for its own node
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import ARRAY, Integer, any_, func, literal, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import ApiTokenRow, NodeRow, TenantRow

Role = Literal["viewer", "member", "operator", "admin", "node"]
PersonRole = Literal["viewer", "member", "operator", "admin"]
RANK: dict[str, int] = {"viewer": 1, "member": 2, "operator": 3, "admin": 4}  # `node` is outside the ladder
TENANT_ROLES = ("viewer", "member")  # the roles held within one tenant; operator and admin hold every tenant
TOKEN_PREFIX = "berth_"  # makes a leaked token recognisable to secret scanners and to people
TOKEN_LENGTH = len(TOKEN_PREFIX) + 43  # secrets.token_urlsafe(32)


def at_least(role: str | None, wanted: str) -> bool:
    return role is not None and RANK.get(role, 0) >= RANK[wanted]


class Principal(BaseModel):
    """Who is calling: a service account's token, a person's OIDC identity, or a node agent's token.

    `role` is the highest role held anywhere, which decides the routes it may call at all; `tenants` holds the role
    in each tenant it belongs to (for an operator or admin, who hold every tenant, it is empty and unused)."""

    model_config = ConfigDict(frozen=True)

    actor: str = Field(description="Who, as the audit trail names it: `token:<id>` or the person's name.")
    kind: Literal["token", "person"] = "token"
    role: Role
    tenants: dict[str, PersonRole] = Field(default_factory=dict)
    node: str | None = None  # set exactly for node tokens
    token_id: int | None = None  # set for tokens
    expires_at: datetime | None = None
    groups: tuple[str, ...] = ()  # a person's groups, as the provider said (shown by `berth whoami`)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def sees_all(self) -> bool:
        """Holds every tenant: an operator or an admin."""
        return self.role in ("operator", "admin")

    def role_in(self, tenant: str) -> str | None:
        """Its role in `tenant`, or None when it has no part in it (it then sees nothing of that tenant)."""
        return self.role if self.sees_all else self.tenants.get(tenant)

    def may_see(self, tenant: str) -> bool:
        return self.role_in(tenant) is not None

    def may_act(self, tenant: str) -> bool:
        return at_least(self.role_in(tenant), "member")

    @property
    def visible(self) -> frozenset[str] | None:
        """The tenants it may see; None: every tenant."""
        return None if self.sees_all else frozenset(self.tenants)

    @property
    def only_tenant(self) -> str | None:
        """Its tenant when it belongs to exactly one (what a request that names none acts for)."""
        return next(iter(self.tenants)) if not self.sees_all and len(self.tenants) == 1 else None


class TokenRefused(BaseModel):
    """Why a well-formed token was refused: `invalid_token` (unknown), `token_revoked` or `token_expired`."""

    code: Literal["invalid_token", "token_revoked", "token_expired"]
    message: str


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


async def create_token(
    session: AsyncSession,
    role: Role,
    tenant: str | None = None,
    label: str | None = None,
    node: str | None = None,
    expires_at: datetime | None = None,
) -> str:
    """Store a new token and return its plaintext, the only time it is ever available. The caller commits. Raises
    ValueError for a role and scope that do not go together, `UnknownScope` for a tenant or node the fleet does not
    have."""
    if (role in TENANT_ROLES) != (tenant is not None) or (role == "node") != (node is not None):
        raise ValueError(
            "a viewer or member token names one tenant; an operator or admin token no tenant (it holds every "
            "tenant); a node token one node"
        )
    if tenant is not None and await session.get(TenantRow, tenant) is None:
        raise UnknownScope("tenant", tenant)
    if node is not None and await session.get(NodeRow, node) is None:
        raise UnknownScope("node", node)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiTokenRow(token_sha256=digest(token), role=role, tenant=tenant, node=node, label=label, expires_at=expires_at)
    )
    await session.flush()
    return token


class UnknownScope(ValueError):
    """The tenant or node a token would be scoped to is not in the fleet."""

    def __init__(self, kind: Literal["tenant", "node"], name: str) -> None:
        super().__init__(f"unknown {kind} {name!r}: apply a fleet file that declares it first")
        self.kind = kind
        self.name = name


def principal_of(row: ApiTokenRow) -> Principal:
    return Principal(
        actor=f"token:{row.id}" + (f" ({row.label})" if row.label else ""),
        role=row.role,  # type: ignore[arg-type]
        tenants={row.tenant: row.role} if row.tenant is not None else {},  # type: ignore[dict-item]
        node=row.node,
        token_id=row.id,
        expires_at=row.expires_at,
    )


async def check(session: AsyncSession, token: str) -> Principal | TokenRefused:
    """The principal a token stands for, or why it is refused (unknown, revoked, expired)."""
    found = (
        await session.execute(select(ApiTokenRow, func.now()).where(ApiTokenRow.token_sha256 == digest(token)))
    ).first()
    if found is None:
        return TokenRefused(code="invalid_token", message="the bearer token is unknown")
    row, now = found
    if row.revoked_at is not None:
        return TokenRefused(
            code="token_revoked", message=f"token {row.id} was revoked at {row.revoked_at:%Y-%m-%d %H:%M:%S} UTC"
        )
    if row.expires_at is not None and row.expires_at <= now:
        return TokenRefused(
            code="token_expired", message=f"token {row.id} expired at {row.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        )
    return principal_of(row)


async def verify(session: AsyncSession, token: str) -> Principal | None:
    """The principal a token stands for, or None when it is unknown, revoked or expired."""
    found = await check(session, token)
    return found if isinstance(found, Principal) else None


async def listed(session: AsyncSession, *, include_ended: bool = False) -> list[ApiTokenRow]:
    """Every token (never its plaintext, which is not kept): live ones only unless `include_ended`."""
    query = select(ApiTokenRow).order_by(ApiTokenRow.id)
    if not include_ended:
        query = query.where(
            ApiTokenRow.revoked_at.is_(None), or_(ApiTokenRow.expires_at.is_(None), ApiTokenRow.expires_at > func.now())
        )
    return list((await session.scalars(query)).all())


async def ensure_tenant_tokens(session: AsyncSession) -> dict[str, str]:
    """Give every tenant without a live token one; return {tenant: plaintext} for the tokens created now.

    Tenants that already hold a token get nothing new: their plaintext is not recoverable, and issuing a second
    one on every `berth apply` would pile up credentials no one asked for."""
    holders = select(ApiTokenRow.tenant).where(ApiTokenRow.tenant.is_not(None), ApiTokenRow.revoked_at.is_(None))
    tenants = (await session.scalars(select(TenantRow.name).where(TenantRow.name.not_in(holders)))).all()
    return {
        tenant: await create_token(session, "member", tenant, label="created for the fleet's tenant")
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
    return admin, {tenant: await create_token(session, "member", tenant, label=DEV_STACK_LABEL) for tenant in tenants}


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
        select(ApiTokenRow.id).where(
            ApiTokenRow.id == any_(ids),
            ApiTokenRow.revoked_at.is_(None),
            or_(ApiTokenRow.expires_at.is_(None), ApiTokenRow.expires_at > func.now()),
        )
    )
    return set(rows.all())


def plausible(token: str) -> bool:
    """Whether `token` could be one `create_token` made: anything else is refused without a database query."""
    return token.startswith(TOKEN_PREFIX) and len(token) <= 2 * TOKEN_LENGTH and token.isascii()
