"""Keyset pages on the list routes: `GET /v1/allocations` and `GET /v1/deployments` answer a page and a
`next_cursor`; following it returns every row exactly once, in order, and a cursor the API did not give out is a
422 `invalid_cursor`. `berth alloc list --all` follows the cursors.

Rows are written straight into PostgreSQL (a list reads only rows): 250 of acme's allocations, three to a timestamp
so that the id decides within one, and ten of globex's between them.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.testing import WorkflowEnvironment

from api import cursor
from contracts.task_queues import Queues
from fleet.loader import load_fleet
from store.apply import apply_fleet
from store.db import create_engine, session_factory
from store.models import AllocationRow, ModelDeploymentRow
from store.tokens import create_token, ensure_tenant_tokens
from tests.api.stack import api_fleet, app_for, bearer, http_client
from tests.cli.test_cli_api import open_terminal

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _allocation(number: int, tenant: str) -> AllocationRow:
    allocation_id = f"{tenant[:1]}{number:04d}"
    return AllocationRow(
        id=allocation_id,
        tenant=tenant,
        state="failed",
        shape="gpu_slice",
        gpu_count=1,
        request={},
        workflow_id=f"allocation/{allocation_id}",
        created_at=T0 + timedelta(seconds=number // 3),
    )


async def _write_rows(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions.begin() as session:
        session.add_all(_allocation(n, "acme") for n in range(250))
        session.add_all(_allocation(n * 25, "globex") for n in range(10))
        session.add_all(
            ModelDeploymentRow(namespace=namespace, name=f"model-{n}", spec={}, replicas=0, status={})
            for namespace in ("default", "team-a")
            for n in range(3)
        )


def _newest_first(rows: list[tuple[datetime, str]]) -> list[str]:
    return [allocation_id for _, allocation_id in sorted(rows, reverse=True)]


ACME = _newest_first([(T0 + timedelta(seconds=n // 3), f"a{n:04d}") for n in range(250)])
GLOBEX = _newest_first([(T0 + timedelta(seconds=n * 25 // 3), f"g{n * 25:04d}") for n in range(10)])


@pytest.fixture
async def api(
    sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, dict[str, str]]]]:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(api_fleet())
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([fleet_file]))
        tokens = {"admin": await create_token(session, "admin")} | await ensure_tenant_tokens(session)
    await _write_rows(sessions)
    app = app_for(sessions, None, Queues(control="unused", node_prefix="unused."))  # lists never reach Temporal
    async with http_client(app) as http:
        yield http, {who: bearer(token) for who, token in tokens.items()}


async def _pages(
    http: httpx.AsyncClient, path: str, headers: dict[str, str], key: str, **params: Any
) -> list[list[Any]]:
    pages: list[list[Any]] = []
    after: str | None = None
    while True:
        response = await http.get(path, params=params | ({"cursor": after} if after else {}), headers=headers)
        assert response.status_code == 200, response.text
        pages.append(response.json()[key])
        after = response.json()["next_cursor"]
        if after is None:
            return pages


async def test_paging_returns_every_allocation_once_newest_first(api: tuple[httpx.AsyncClient, Any]) -> None:
    http, who = api
    pages = await _pages(http, "/v1/allocations", who["acme"], "allocations", limit=100)
    assert [len(page) for page in pages] == [100, 100, 50]
    assert [a["id"] for page in pages for a in page] == ACME

    everyone = await _pages(http, "/v1/allocations", who["admin"], "allocations", limit=100)
    ids = [a["id"] for page in everyone for a in page]
    assert len(ids) == len(set(ids)) == 260
    assert ids == _newest_first([(T0 + timedelta(seconds=int(i[1:]) // 3), i) for i in ACME + GLOBEX])


async def test_a_tenant_pages_through_its_own_only(api: tuple[httpx.AsyncClient, Any]) -> None:
    http, who = api
    pages = await _pages(http, "/v1/allocations", who["globex"], "allocations", limit=3)
    assert [len(page) for page in pages] == [3, 3, 3, 1]
    assert [a["id"] for page in pages for a in page] == GLOBEX
    # An admin's filters hold on every page, as a tenant's scope does.
    filtered = await _pages(http, "/v1/allocations", who["admin"], "allocations", limit=4, tenant="globex")
    assert [a["id"] for page in filtered for a in page] == GLOBEX


async def test_a_last_full_page_says_there_is_no_next(api: tuple[httpx.AsyncClient, Any]) -> None:
    http, who = api
    response = await http.get("/v1/allocations", params={"limit": 10}, headers=who["globex"])
    assert response.status_code == 200 and response.json()["next_cursor"] is None


def _b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("not a cursor!", "not base64url of JSON"),
        (cursor.encode("deployments", "default", "model-0"), "not a cursor of allocations"),
        (_b64({"at": "2026-01-01"}), "not a cursor of allocations"),
        (_b64(["allocations", "2026-01-01T00:00:00+00:00"]), "malformed position"),
        (_b64(["allocations", "yesterday", "a0001"]), "malformed position"),
        (_b64(["allocations", "2026-01-01T00:00:00", "a0001"]), "malformed position"),  # no timezone
        (_b64(["allocations", 5, "a0001"]), "malformed position"),
    ],
)
async def test_an_invalid_cursor_is_422(api: tuple[httpx.AsyncClient, Any], given: str, why: str) -> None:
    http, who = api
    response = await http.get("/v1/allocations", params={"cursor": given}, headers=who["acme"])
    assert response.status_code == 422, response.text
    assert response.json()["error"] == {
        "code": "invalid_cursor",
        "message": f"cursor is not one this list gave out: {why}",
        "details": [{"field": "query.cursor", "message": why, "type": "invalid_cursor"}],
    }


async def test_deployments_page_by_namespace_and_name(api: tuple[httpx.AsyncClient, Any]) -> None:
    http, who = api
    pages = await _pages(http, "/v1/deployments", who["admin"], "deployments", limit=4)
    assert [[(d["namespace"], d["name"]) for d in page] for page in pages] == [
        [("default", "model-0"), ("default", "model-1"), ("default", "model-2"), ("team-a", "model-0")],
        [("team-a", "model-1"), ("team-a", "model-2")],
    ]
    one = await _pages(http, "/v1/deployments", who["admin"], "deployments", limit=1, namespace="team-a")
    assert [d["name"] for page in one for d in page] == ["model-0", "model-1", "model-2"]
    wrong = await http.get(
        "/v1/deployments", params={"cursor": cursor.encode("allocations", "x", "y")}, headers=who["admin"]
    )
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "invalid_cursor"


async def test_nodes_page_by_name(api: tuple[httpx.AsyncClient, Any]) -> None:
    http, who = api
    everything = (await http.get("/v1/nodes", headers=who["admin"])).json()
    assert everything["next_cursor"] is None
    names = [node["name"] for node in everything["nodes"]]
    assert len(names) >= 3 and names == sorted(names)
    pages = await _pages(http, "/v1/nodes", who["admin"], "nodes", limit=2)
    assert [[node["name"] for node in page] for page in pages] == [names[i : i + 2] for i in range(0, len(names), 2)]
    wrong = await http.get("/v1/nodes", params={"cursor": cursor.encode("deployments", "a", "b")}, headers=who["admin"])
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "invalid_cursor"


def test_berth_alloc_list_follows_the_cursors(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with open_terminal(database_url, temporal_env, tmp_path, api_fleet()) as terminal:
        engine = create_engine(database_url)

        async def write() -> None:
            try:
                await _write_rows(session_factory(engine))
            finally:
                await engine.dispose()

        asyncio.run(write())
        every = terminal.json("alloc", "list", "--tenant", "acme", "--all", "--limit", "100")
        assert [a["id"] for a in every["allocations"]] == ACME and every["next_cursor"] is None

        first = terminal.json("alloc", "list", "--tenant", "acme", "--limit", "100")
        assert [a["id"] for a in first["allocations"]] == ACME[:100]
        rest = terminal.json("alloc", "list", "--tenant", "acme", "--limit", "200", "--cursor", first["next_cursor"])
        assert [a["id"] for a in rest["allocations"]] == ACME[100:] and rest["next_cursor"] is None

        shown = terminal.ok("alloc", "list", "--tenant", "acme", "--limit", "5")
        assert f"More: berth alloc list --cursor {first_cursor_after(5)} (or --all)." in shown
        bad = terminal.berth("alloc", "list", "--cursor", "nope")
        assert bad.exit_code == 1 and "Traceback" not in bad.output
        assert "cursor is not one this list gave out" in bad.stderr


def first_cursor_after(count: int) -> str:
    """The cursor the API gives after acme's newest `count` allocations."""
    last = ACME[count - 1]
    return cursor.encode("allocations", (T0 + timedelta(seconds=int(last[1:]) // 3)).isoformat(), last)
