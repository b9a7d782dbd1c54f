"""The request log (`api_requests`): every mutating API request, who made it and how it was answered
(api/request_log.py writes it, `GET /v1/audit/requests` reads it, the reconciler forgets what is past its
retention)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import ApiRequestRow


async def record(
    session: AsyncSession, *, actor: str, role: str, method: str, route: str, path: str, status: int
) -> None:
    session.add(ApiRequestRow(actor=actor, role=role, method=method, route=route, path=path, status=status))


async def newest(
    session: AsyncSession, *, actor: str | None = None, since: datetime | None = None, limit: int = 100
) -> list[ApiRequestRow]:
    """Newest first: one actor's, from `since`, at most `limit`."""
    query = select(ApiRequestRow).order_by(ApiRequestRow.id.desc()).limit(limit)
    if actor is not None:
        query = query.where(ApiRequestRow.actor == actor)
    if since is not None:
        query = query.where(ApiRequestRow.at >= since)
    return list((await session.scalars(query)).all())


async def prune(session: AsyncSession, before: datetime, limit: int = 10_000) -> int:
    """Forget the records older than `before`, at most `limit` a call (each audit run takes one bite, so a backlog
    is worked off without one long transaction); how many went."""
    oldest = select(ApiRequestRow.id).where(ApiRequestRow.at < before).order_by(ApiRequestRow.id).limit(limit)
    return (await session.execute(delete(ApiRequestRow).where(ApiRequestRow.id.in_(oldest)))).rowcount or 0
