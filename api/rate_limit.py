"""Create rate limits over `POST /v1/allocations`: per tenant (the fleet file's `Tenant.spec.rateLimit`) and per
person or service account (`BERTH_PERSON_CREATES_PER_SECOND`, `BERTH_PERSON_CREATE_BURST`).

Each is a token bucket: it holds up to `burst` tokens and refills at `createsPerSecond`; a create takes one token
from each bucket that applies or is refused with 429 `rate_limited` and a `Retry-After` of the whole seconds until a
token is back (at least 1), taking none. A limit without a bucket yet, or whose size changed (a fleet apply), starts
full.

The buckets live in PostgreSQL (`rate_limit_buckets`), so a tenant's limit holds whatever the number of API
replicas: each take locks its bucket's row for one short transaction, and time is PostgreSQL's clock, the same for
every replica. (In-process buckets gave each replica the whole allowance, and a restart refilled them all.)

Why a bucket of our own rather than pyrate-limiter (installed here only as a dependency of schemathesis): its
token bucket arrived in 4.x behind an algorithm interface its own docstring calls internal until 5.0, its Limiter
counts integer limits per integer-millisecond interval (a fractional `createsPerSecond` must be re-expressed) and
its shared backends are Redis and SQLite; what is needed here is a dozen lines of arithmetic on a locked row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from api.errors import ApiError
from store import rate_limits
from store.db import AsyncSession, async_sessionmaker
from store.tokens import Principal

Clock = Callable[[], float]  # seconds; None: PostgreSQL's clock


@dataclass
class TokenBucket:
    """`tokens` as of `at` (clock seconds); refilled lazily on each take."""

    rate: float  # tokens per second
    burst: int
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """Take a token: 0.0 when taken, else the seconds until one will be there (nothing is taken then)."""
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)
        if self.tokens >= 1.0 - 1e-9:  # the refill is floating point: 0.1/s for 10 s must make a whole token
            self.tokens = max(0.0, self.tokens - 1.0)
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(frozen=True)
class Limit:
    rate: float
    burst: int

    @staticmethod
    def of(limit: Mapping[str, object] | None) -> Limit | None:
        """A tenant's `rate_limit` column (`{"creates_per_second", "burst"}`), or None."""
        if not limit:
            return None
        return Limit(float(limit["creates_per_second"]), int(limit["burst"]))  # type: ignore[arg-type]


class CreateLimits:
    """The buckets of the limits that apply to a create. `clock` is injectable so tests step time instead of
    sleeping; by default time is PostgreSQL's."""

    def __init__(self, clock: Clock | None = None, person: Limit | None = None) -> None:
        self.clock = clock
        self.person = person

    async def check(
        self,
        sessions: async_sessionmaker[AsyncSession],
        tenant: str,
        tenant_limit: Mapping[str, object] | None,
        caller: Principal,
    ) -> None:
        """Take one create's token from the tenant's bucket and the caller's, or raise 429 `rate_limited` with
        `Retry-After` having taken none."""
        wanted: list[tuple[str, Limit, str, dict[str, object]]] = []
        if (limit := Limit.of(tenant_limit)) is not None:
            wanted.append((f"tenant:{tenant}", limit, f"tenant {tenant}", {"tenant": tenant}))
        if self.person is not None:
            wanted.append((f"actor:{caller.actor}", self.person, caller.actor, {"actor": caller.actor}))
        if not wanted:
            return
        async with sessions.begin() as session:  # a refusal rolls back: nothing is taken from any bucket
            for key, limit, who, whose in wanted:  # in this order everywhere: no two creates wait on each other
                wait = await self._take(session, key, limit)
                if wait > 0:
                    raise _limited(who, whose, limit, wait)

    async def _take(self, session: AsyncSession, key: str, limit: Limit) -> float:
        now = self.clock() if self.clock is not None else await rate_limits.now(session)
        rate, burst, tokens, at = await rate_limits.locked(session, key, limit.rate, limit.burst, now)
        bucket = TokenBucket(rate=rate, burst=burst, tokens=tokens, at=at)
        if (rate, burst) != (limit.rate, limit.burst):  # the limit changed: a new, full bucket of the new size
            bucket = TokenBucket(rate=limit.rate, burst=limit.burst, tokens=float(limit.burst), at=now)
        wait = bucket.take(now)
        await rate_limits.save(session, key, bucket.rate, bucket.burst, bucket.tokens, bucket.at)
        return wait


def _limited(who: str, whose: dict[str, object], limit: Limit, wait: float) -> ApiError:
    retry_after = max(1, math.ceil(wait))
    return ApiError(
        429,
        "rate_limited",
        f"{who} may create {limit.rate:g} allocation(s) per second (bursts of {limit.burst}); retry in {retry_after} s",
        {**whose, "creates_per_second": limit.rate, "burst": limit.burst, "retry_after_seconds": retry_after},
        headers={"Retry-After": str(retry_after)},
    )
