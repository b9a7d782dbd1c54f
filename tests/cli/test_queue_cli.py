"""`berth queue`, `berth alloc get` on a queued allocation and `berth alloc create --queue-timeout --priority-class`,
run as a person runs them next to `berth up`: the real API served by uvicorn, the context file only.

The queues are those of tests/api/test_queues_api.py, written straight into PostgreSQL (no workflow moves them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.testing import WorkflowEnvironment

from store.db import create_engine, session_factory
from store.models import AllocationRow
from tests.api.test_queues_api import LAB_ORDER, queue_fleet, write_queues
from tests.cli.test_cli_api import one_error_line, open_terminal

T = TypeVar("T")


def _run(database_url: str, work: Callable[[async_sessionmaker[AsyncSession]], Awaitable[T]]) -> T:
    """`work` on the test's database, from this thread (the API serves on its own)."""

    async def run() -> T:
        engine = create_engine(database_url)
        try:
            return await work(session_factory(engine))
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _lines_with(text: str, *words: str) -> list[str]:
    return [line for line in text.splitlines() if all(word in line for word in words)]


def test_berth_queue_shows_each_region_in_admission_order(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with open_terminal(database_url, temporal_env, tmp_path, queue_fleet()) as terminal:
        _run(database_url, write_queues)

        shown = terminal.ok("queue")
        assert "east (BestEffortFIFO): 1 waiting" in shown and "lab (BestEffortFIFO): 5 waiting" in shown
        rows = [line for line in shown.splitlines() if any(f"│ {a} " in line for a in LAB_ORDER)]
        assert [line.split("│")[2].strip() for line in rows] == LAB_ORDER  # the admission order
        # The table's first cells, one row per request; the why column wraps as the terminal's width and the other
        # columns' lengths decide, so the reasons are read from the same command's JSON.
        assert _lines_with(shown, "│ 1 │ a-urgent", "acme", "100 (urgent)", "4 H200 GPUs, gpu_slice", "0.0%")
        assert _lines_with(shown, "│ 3 │ g-first", "globex", "0.0%")
        assert _lines_with(shown, "│ 2 │ a-first", "0 (batch)")
        assert _lines_with(shown, "│ 4 │ i-first", "initech", "0.0%")
        assert _lines_with(shown, "│ 1 │ x-east", "acme", "2 H200 GPUs")
        why = {e["allocation_id"]: e["status"] for r in terminal.json("queue")["regions"] for e in r["entries"]}
        assert why["a-urgent"].startswith("head of the queue: node big is reserved for it")
        assert why["g-first"].startswith("behind 1 request(s): the head, a-urgent")
        assert why["a-first"] == "being placed on small"
        assert why["i-first"].startswith("quota: tenant initech would exceed")

        theirs = terminal.ok("queue", "--tenant", "globex", "--region", "lab")
        assert "lab (BestEffortFIFO): 5 waiting, 2 of them yours" in theirs
        everywhere = terminal.ok("queue", "--tenant", "globex")
        assert "east (BestEffortFIFO): 1 waiting, none of them yours" in everywhere
        assert _lines_with(theirs, "│ 3 │ g-first") and _lines_with(theirs, "│ 5 │ g-second")
        assert not any(other in theirs for other in ("a-urgent", "a-first", "i-first", "east"))
        mine = terminal.json("queue", "--tenant", "globex", "--region", "lab")["regions"][0]["entries"]
        assert [(e["allocation_id"], e["position"]) for e in mine] == [("g-first", 3), ("g-second", 5)]
        assert mine[0]["status"].startswith("behind 1 request(s): the head, a request of another tenant, does not fit")
        assert mine[1]["status"] == "waiting for the next admission pass"

        as_json = terminal.json("queue", "--region", "east")
        assert [[e["allocation_id"] for e in r["entries"]] for r in as_json["regions"]] == [["x-east"]]

        unknown = terminal.berth("queue", "--region", "nowhere")
        assert one_error_line(unknown) == (
            "error: region 'nowhere' does not exist in the fleet; choose one of: east, lab (unknown_region, HTTP 422)"
        )

        detail = terminal.ok("alloc", "get", "g-first", "--tenant", "globex")
        assert _lines_with(detail, "Queue", "position 3 in lab, priority 0, waited ")
        assert _lines_with(detail, "Waiting", "behind 1 request(s): the head, a request of another tenant")
        active = terminal.ok("alloc", "get", "held-acme")
        assert "Queue" not in active and "Waiting" not in active


def test_alloc_create_asks_to_wait_with_a_priority_class(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with open_terminal(database_url, temporal_env, tmp_path, queue_fleet()) as terminal:
        unknown = terminal.berth("alloc", "create", "--gpus", "1", "--queue-timeout", "30m", "--priority-class", "vip")
        assert "PriorityClass 'vip' does not exist (unknown_priority_class, HTTP 422)" in one_error_line(unknown)
        bad = terminal.berth("alloc", "create", "--gpus", "1", "--queue-timeout", "soon")
        assert "--queue-timeout 'soon' is not a duration" in one_error_line(bad)  # read before anything is sent

        created = terminal.json(
            "alloc",
            "create",
            "--gpus",
            "1",
            "--tenant",
            "globex",
            "--queue-timeout",
            "30m",
            "--priority-class",
            "urgent",
        )

        async def recorded(sessions: async_sessionmaker[AsyncSession]) -> Any:
            async with sessions() as session:
                return await session.scalar(select(AllocationRow.request).where(AllocationRow.id == created["id"]))

        request = _run(database_url, recorded)  # the body as the API recorded it
        assert request["queue"] == {"timeout": 1800.0} and request["priority_class"] == "urgent"
