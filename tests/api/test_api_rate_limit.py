"""Per-tenant create rate limits: the fleet file's `Tenant.spec.rateLimit` is a token bucket over
`POST /v1/allocations`; the create past it is a 429 `rate_limited` with `Retry-After`, creating nothing, and time
refills it. The API's clock is stepped by the test (no sleeps): `Services.create_limits` takes an injected clock.

Tenant `initech` (added to the lab fleet of tests/api/stack.py): 0.5 creates per second, bursts of 2.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from api.rate_limit import CreateLimits
from fleet.tenant import Tenant
from store.models import AllocationRow
from store.tokens import ensure_tenant_tokens
from tests.api.stack import api_fleet, app_for, bearer, control_worker_seen, http_client
from tests.workflows.lab import running_lab

INITECH = {
    "apiVersion": "berth.dev/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "initech"},
    "spec": {"gpuQuota": 64, "rateLimit": {"createsPerSecond": 0.5, "burst": 2}},
}


class SteppedClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Limited:
    http: httpx.AsyncClient
    clock: SteppedClock
    sessions: async_sessionmaker[AsyncSession]
    initech: dict[str, str]
    acme: dict[str, str]

    async def create(self, who: dict[str, str], key: str | None = None) -> httpx.Response:
        headers = who | ({"Idempotency-Key": key} if key else {})
        return await self.http.post("/v1/allocations", json={"gpu_count": 1}, headers=headers)

    async def rows(self, tenant: str) -> int:
        async with self.sessions() as session:
            query = select(func.count()).select_from(AllocationRow).where(AllocationRow.tenant == tenant)
            return int(await session.scalar(query) or 0)


@pytest.fixture
async def limited(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> AsyncIterator[Limited]:
    fleet = api_fleet() + "---\n" + yaml.safe_dump(INITECH, sort_keys=False)
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        async with sessions.begin() as session:
            tokens = await ensure_tenant_tokens(session)
        app = app_for(sessions, temporal_client, lab.queues)
        clock = SteppedClock()
        app.state.services.create_limits = CreateLimits(clock)
        await control_worker_seen(app)
        async with http_client(app) as http:
            yield Limited(http, clock, sessions, bearer(tokens["initech"]), bearer(tokens["acme"]))


async def test_the_create_past_the_burst_is_429_until_the_clock_refills_the_bucket(limited: Limited) -> None:
    assert [(await limited.create(limited.initech)).status_code for _ in range(2)] == [202, 202]

    refused = await limited.create(limited.initech)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "2"  # one token at 0.5 a second
    assert refused.json()["error"] == {
        "code": "rate_limited",
        "message": "tenant initech may create 0.5 allocation(s) per second (bursts of 2); retry in 2 s",
        "details": {"tenant": "initech", "creates_per_second": 0.5, "burst": 2, "retry_after_seconds": 2},
    }
    assert await limited.rows("initech") == 2  # the refused create left nothing behind

    limited.clock.now += 1.5  # three quarters of a token: still refused, and told to come back in whole seconds
    again = await limited.create(limited.initech)
    assert again.status_code == 429 and again.headers["Retry-After"] == "1"
    limited.clock.now += 0.5
    assert (await limited.create(limited.initech)).status_code == 202
    assert (await limited.create(limited.initech)).status_code == 429  # that token is spent; the next is 2 s off
    assert await limited.rows("initech") == 3


async def test_a_tenant_without_a_limit_is_not_held_back(limited: Limited) -> None:
    assert [(await limited.create(limited.initech)).status_code for _ in range(3)] == [202, 202, 429]
    # acme has no rateLimit: a burst larger than initech's passes, whatever initech's bucket holds.
    assert [(await limited.create(limited.acme)).status_code for _ in range(4)] == [202] * 4


async def test_a_retried_key_is_answered_even_with_an_empty_bucket(limited: Limited) -> None:
    key = f"retry-{uuid.uuid4().hex}"  # Temporal outlives each test's database: keys must not repeat across tests
    first = await limited.create(limited.initech, key)
    assert first.status_code == 202, first.text
    assert (await limited.create(limited.initech)).status_code == 202
    assert (await limited.create(limited.initech)).status_code == 429  # the bucket is empty now

    replay = await limited.create(limited.initech, key)
    assert replay.status_code == 200, replay.text
    assert replay.json()["id"] == first.json()["id"]


@pytest.mark.parametrize(
    ("limit", "field"),
    [({"createsPerSecond": 0, "burst": 1}, "createsPerSecond"), ({"createsPerSecond": 1, "burst": 0}, "burst")],
)
def test_a_rate_limit_must_admit_something(limit: dict[str, float], field: str) -> None:
    spec = {**INITECH, "spec": {"gpuQuota": 1, "rateLimit": limit}}
    with pytest.raises(ValidationError, match=field):
        Tenant.model_validate(spec)
