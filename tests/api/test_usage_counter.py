"""`berth_gpu_seconds_total` never goes down, read as Prometheus reads it (`Metrics.render`, what `GET /metrics`
serves) against a real PostgreSQL while allocations are released and expire.

A release stamps its GPUs' end with its transaction's start (`now()`), and the ledger shows that end only once the
release commits. A scrape in between must not have counted the open interval past that end: Prometheus reads any
decrease as a counter reset, and increase() and rate() then add the whole total again."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.metrics import Metrics
from fleet.loader import load_fleet
from store import usage
from store.apply import apply_fleet
from store.claims import release_claims
from store.models import AllocationEventRow
from tests.store.test_usage_ledger import hold

_SAMPLE = re.compile(r'^berth_gpu_seconds_total\{product="([^"]*)",region="([^"]*)",tenant="([^"]*)"\} (\S+)$', re.M)

Series = tuple[str, str, str]


async def scrape(sessions: async_sessionmaker[AsyncSession], metrics: Metrics) -> dict[Series, float]:
    """One scrape of `/metrics` as the endpoint makes it (its own session), the GPU-seconds of each series."""
    async with sessions() as session:
        body = (await metrics.render(session)).decode()
    return {(tenant, product, region): float(value) for product, region, tenant, value in _SAMPLE.findall(body)}


async def release(
    sessions: async_sessionmaker[AsyncSession],
    allocation: str,
    step: str,
    held_open: float,
    while_open: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Release the allocation's claims as the workflow's release_claims does (its trail's step, `release` or
    `expire`, then the claims, in one transaction), keeping that transaction open `held_open` seconds after the
    update, and awaiting `while_open` (if given) before it commits."""
    async with sessions.begin() as session:
        session.add(AllocationEventRow(allocation_id=allocation, event_key=f"{step}-1", state="releasing", step=step))
        await session.flush()
        assert await release_claims(session, allocation, None) > 0
        await asyncio.sleep(held_open)
        if while_open is not None:
            await while_open()


async def _fleet(sessions: async_sessionmaker[AsyncSession], examples_dir) -> None:
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))


@pytest.mark.parametrize("step", ["release", "expire"])
async def test_a_scrape_before_a_release_commits_reads_no_more_than_the_release_leaves(
    sessions, examples_dir, step: str
) -> None:
    await _fleet(sessions, examples_dir)
    await hold(sessions, "k-1", "acme", [0, 1], datetime.now(UTC) - timedelta(minutes=10), None)
    metrics = Metrics()
    during: dict[Series, float] = {}

    async def scrape_now() -> None:
        during.update(await scrape(sessions, metrics))

    # The release's UPDATE has run and its transaction is still open for a moment: a scrape then still sees the
    # interval open, and the release will close it at its transaction's start.
    await release(sessions, "k-1", step, held_open=0.3, while_open=scrape_now)
    after = await scrape(sessions, metrics)
    series = ("acme", "H200", "us-east")
    assert during[series] > 1200  # two GPUs for the ten minutes so far
    assert after[series] >= during[series], f"the counter went from {during[series]} down to {after[series]}"


async def test_the_counter_never_decreases_while_allocations_end_under_continuous_scrapes(
    sessions, examples_dir
) -> None:
    await _fleet(sessions, examples_dir)
    began = datetime.now(UTC) - timedelta(minutes=10)
    allocations = [f"c-{slot}" for slot in range(6)]
    for slot, allocation in enumerate(allocations):
        await hold(sessions, allocation, "acme" if slot % 2 else "globex", [slot], began, None)
    # Two API processes, as behind a load balancer: one series, whichever of them answers each scrape.
    processes = [Metrics(), Metrics()]
    seen: dict[Series, list[float]] = {}
    done = asyncio.Event()

    async def scraper() -> None:
        while not done.is_set():
            for metrics in processes:
                for series, value in (await scrape(sessions, metrics)).items():
                    seen.setdefault(series, []).append(value)

    async def end(allocation: str, order: int) -> None:
        await asyncio.sleep(0.05 * order)
        await release(sessions, allocation, "expire" if order % 3 == 0 else "release", random.uniform(0.05, 0.2))

    scraping = asyncio.create_task(scraper())
    try:
        await asyncio.gather(*(end(a, order) for order, a in enumerate(allocations)))
        await asyncio.sleep(0.1)
    finally:
        done.set()
        await scraping
    assert set(seen) == {("acme", "H200", "us-east"), ("globex", "H200", "us-east")}
    for series, values in seen.items():
        assert len(values) > 10, (series, values)
        drops = [(a, b) for a, b in zip(values, values[1:], strict=False) if b < a]
        assert not drops, f"{series} went down: {drops}"


async def test_a_transaction_left_open_holds_the_count_back_until_it_ends(sessions, examples_dir) -> None:
    await _fleet(sessions, examples_dir)
    await hold(sessions, "k-1", "acme", [0, 1], datetime.now(UTC) - timedelta(minutes=10), None)
    metrics = Metrics()
    series = ("acme", "H200", "us-east")
    async with sessions() as idle:
        await idle.execute(text("SELECT 1"))  # a transaction begun, which could still release claims at its start
        held = await scrape(sessions, metrics)
        await asyncio.sleep(0.5)
        assert (await scrape(sessions, metrics))[series] == held[series]  # the open part waits for it
    caught_up = await scrape(sessions, metrics)
    assert caught_up[series] >= held[series] + 2 * 0.5  # two GPUs for the half second it waited, and more


async def test_the_counter_is_read_under_read_committed_only(sessions) -> None:
    async with sessions() as session:
        await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        with pytest.raises(RuntimeError, match="READ COMMITTED"):
            await usage.gpu_seconds_totals(session)
