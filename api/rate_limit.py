"""Per-tenant token buckets over `POST /v1/allocations` (the fleet file's `Tenant.spec.rateLimit`).

A tenant's bucket holds up to `burst` tokens and refills at `createsPerSecond`; a create takes one token or is
refused with 429 `rate_limited` and a `Retry-After` of the whole seconds until a token is back (at least 1). The
buckets live in this API process: with several API processes a tenant gets each one's allowance, and a restart
starts every bucket full. A tenant without `rateLimit` is not limited.

Why a bucket of our own rather than pyrate-limiter (installed here only as a dependency of schemathesis): its
token bucket arrived in 4.x behind an algorithm interface its own docstring calls internal until 5.0, its Limiter
counts integer limits per integer-millisecond interval (a fractional `createsPerSecond` must be re-expressed) and
schedules background leak tasks; what is needed here is a dozen lines of arithmetic with an injectable clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from api.errors import ApiError

Clock = Callable[[], float]  # monotonic seconds


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


class CreateLimits:
    """One bucket per tenant, sized by the tenant's current `rate_limit`: a changed limit (a fleet apply) starts a
    new, full bucket of the new size. `clock` is injectable so tests step time instead of sleeping."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, tenant: str, limit: Mapping[str, object] | None) -> None:
        """Take one create's token for `tenant`, or raise 429 `rate_limited` with `Retry-After`."""
        if not limit:
            self._buckets.pop(tenant, None)
            return
        rate, burst = float(limit["creates_per_second"]), int(limit["burst"])  # type: ignore[arg-type]
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):
            bucket = self._buckets[tenant] = TokenBucket(rate=rate, burst=burst, tokens=float(burst), at=now)
        wait = bucket.take(now)
        if wait > 0:
            retry_after = max(1, math.ceil(wait))
            raise ApiError(
                429,
                "rate_limited",
                f"tenant {tenant} may create {rate:g} allocation(s) per second (bursts of {burst}); "
                f"retry in {retry_after} s",
                {"tenant": tenant, "creates_per_second": rate, "burst": burst, "retry_after_seconds": retry_after},
                headers={"Retry-After": str(retry_after)},
            )
