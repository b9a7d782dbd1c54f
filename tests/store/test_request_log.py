"""The request log (who asked what, api/request_log.py) keeps its records for its retention, and the reconciler
forgets older ones a bite at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from store.models import ApiRequestRow
from store.requests import prune

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


async def test_records_past_the_retention_go_oldest_first_and_newer_ones_stay(sessions) -> None:
    async with sessions.begin() as session:
        for days, actor in ((200, "a"), (120, "b"), (100, "c"), (10, "d")):
            session.add(
                ApiRequestRow(
                    at=NOW - timedelta(days=days),
                    actor=actor,
                    role="member",
                    method="POST",
                    route="/v1/allocations",
                    path="/v1/allocations",
                    status=202,
                )
            )
    cutoff = NOW - timedelta(days=90)
    async with sessions.begin() as session:
        assert await prune(session, cutoff, limit=2) == 2
    async with sessions() as session:
        assert (await session.scalars(select(ApiRequestRow.actor).order_by(ApiRequestRow.id))).all() == ["c", "d"]
    async with sessions.begin() as session:
        assert await prune(session, cutoff, limit=2) == 1
        assert await prune(session, cutoff, limit=2) == 0
    async with sessions() as session:
        assert (await session.scalars(select(ApiRequestRow.actor))).all() == ["d"]
