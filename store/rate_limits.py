"""Token buckets every API process shares (`rate_limit_buckets`, api/rate_limit.py decides what to take): one row per
bucket, read and written under its row lock, time in epoch seconds from PostgreSQL's clock unless the caller steps
its own."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

_NOW = text("SELECT extract(epoch FROM clock_timestamp())")
_CREATE = text(
    "INSERT INTO rate_limit_buckets (key, rate, burst, tokens, at)"
    " VALUES (:key, :rate, CAST(:burst AS integer), CAST(:burst AS float8), :now)"
    " ON CONFLICT (key) DO NOTHING"
)
_LOCK = text("SELECT rate, burst, tokens, at FROM rate_limit_buckets WHERE key = :key FOR UPDATE")
_SAVE = text("UPDATE rate_limit_buckets SET rate = :rate, burst = :burst, tokens = :tokens, at = :at WHERE key = :key")


async def now(session: AsyncSession) -> float:
    """PostgreSQL's clock, the same for every API process."""
    return float(await session.scalar(_NOW) or 0.0)


async def locked(
    session: AsyncSession, key: str, rate: float, burst: int, at: float
) -> tuple[float, int, float, float]:
    """The bucket `key` as (rate, burst, tokens, at), locked until the transaction ends; made full if it was not
    there yet."""
    await session.execute(_CREATE, {"key": key, "rate": rate, "burst": burst, "now": at})
    rate_, burst_, tokens, at_ = (await session.execute(_LOCK, {"key": key})).one()
    return float(rate_), int(burst_), float(tokens), float(at_)


async def save(session: AsyncSession, key: str, rate: float, burst: int, tokens: float, at: float) -> None:
    await session.execute(_SAVE, {"key": key, "rate": rate, "burst": burst, "tokens": tokens, "at": at})
