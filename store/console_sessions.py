"""The web console's sessions in PostgreSQL (console/sessions.py decides what they hold; this module only keeps them).

A row is found by the SHA-256 of the secret its browser's cookie holds, never by the secret itself; what it holds is
sealed by the console with a key derived from that secret. Expired rows are deleted as new ones are written.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import ConsoleSessionRow


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def keep(
    session: AsyncSession, secret: str, kind: str, sealed: str, expires_at: datetime, actor: str | None = None
) -> None:
    """Write (or replace) the row of `secret`, and drop every expired one."""
    await session.execute(delete(ConsoleSessionRow).where(ConsoleSessionRow.expires_at < datetime.now(UTC)))
    await session.merge(
        ConsoleSessionRow(secret_sha256=digest(secret), kind=kind, sealed=sealed, actor=actor, expires_at=expires_at)
    )


async def find(session: AsyncSession, secret: str, kind: str) -> ConsoleSessionRow | None:
    """The live row of `secret` of this kind, or None (unknown, expired, or of the other kind)."""
    row = await session.scalar(
        select(ConsoleSessionRow).where(
            ConsoleSessionRow.secret_sha256 == digest(secret),
            ConsoleSessionRow.kind == kind,
            ConsoleSessionRow.expires_at > datetime.now(UTC),
        )
    )
    return row


async def forget(session: AsyncSession, secret: str) -> None:
    await session.execute(delete(ConsoleSessionRow).where(ConsoleSessionRow.secret_sha256 == digest(secret)))
