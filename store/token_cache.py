"""Verified node tokens, remembered for minutes and forgotten within a second or two of their revocation.

Ten thousand agents reporting every minute, and every call a node gateway passes on, must not each cost a token
look-up; but a revoked node token must stop working within seconds, in every API process and every node gateway.
So a verified token is kept for `TTL_SECONDS`, and the cache is trusted only while its revocation sweep
is fresh: at most every `SWEEP_SECONDS`, the first caller that finds it stale asks PostgreSQL which tokens were
revoked within the TTL (one small query per process, whatever the number of agents) and drops them. When the sweep
cannot run (the database is down), nothing cached is trusted: every token is verified afresh, which fails closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.tokens import Principal, TokenRefused, check, digest, plausible, still_live

TTL_SECONDS = 600.0
SWEEP_SECONDS = 1.0
# A sweep older than this is not trusted at all (one missed sweep is tolerated): revocation within 2.5 s.
STALE_SECONDS = 2.5 * SWEEP_SECONDS


class TokenCache:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, on_revoked: Callable[[set[int]], None] | None = None
    ) -> None:
        self._clock = clock
        self.on_revoked = on_revoked  # told the ids no longer live after a sweep (the gateway cuts their polls)
        self._entries: dict[str, tuple[Principal, float]] = {}  # digest -> (principal, until)
        self._swept_at = float("-inf")
        self._sweeping = asyncio.Lock()

    def cached(self, token: str) -> Principal | None:
        """The principal of a token verified recently and not revoked since, without any I/O; None when unsure."""
        if self._clock() - self._swept_at > STALE_SECONDS:
            return None
        entry = self._entries.get(digest(token))
        if entry is None or entry[1] <= self._clock():
            return None
        return entry[0]

    async def principal(self, sessions: async_sessionmaker[AsyncSession], token: str) -> Principal | None:
        """Whom `token` stands for (None: unknown, revoked or expired), from the cache when its sweep is fresh."""
        found = await self.check(sessions, token)
        return found if isinstance(found, Principal) else None

    async def check(self, sessions: async_sessionmaker[AsyncSession], token: str) -> Principal | TokenRefused:
        """Whom `token` stands for, or why it is refused; node tokens from the cache when its sweep is fresh."""
        if not plausible(token):
            return TokenRefused(code="invalid_token", message="the bearer is not a Berth token")
        await self.sweep(sessions)
        cached = self.cached(token)
        if cached is not None:
            return cached
        async with sessions() as session:
            found = await check(session, token)
        if isinstance(found, Principal) and found.role == "node":  # service accounts are few and rarely per second
            self._entries[digest(token)] = (found, self._clock() + TTL_SECONDS)
        return found

    async def sweep(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """Forget cached tokens that are no longer live, at most once per `SWEEP_SECONDS` (callers in between return
        at once)."""
        if self._clock() - self._swept_at < SWEEP_SECONDS:
            return
        async with self._sweeping:
            if self._clock() - self._swept_at < SWEEP_SECONDS:
                return  # another caller swept while this one waited
            started = self._clock()
            cached = {principal.token_id for principal, _until in self._entries.values()}
            async with sessions() as session:
                live = await still_live(session, cached)
            gone = cached - live
            if gone:
                self._entries = {k: v for k, v in self._entries.items() if v[0].token_id not in gone}
                if self.on_revoked is not None:
                    self.on_revoked(gone)
            self._swept_at = started
