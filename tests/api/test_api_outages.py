"""Exactly-once creates and honest answers while PostgreSQL or Temporal fail.

The API under test reaches the session's real PostgreSQL and Temporal server through a loopback TCP proxy
(`tests/faults.py`) that a test cuts and restores: the client side sees real resets and refusals. Every answer must
be true: a 503 names the dependency and means nothing was created; a 202 or 200 names the one allocation a tenant's
Idempotency-Key can ever have.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import func, make_url, select
from sqlalchemy.exc import InternalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from api.routes.allocations import keyed_allocation_id
from store.db import create_engine, session_factory
from store.models import AllocationRow
from store.outage import is_database_outage
from store.tokens import create_token, ensure_tenant_tokens
from tests.api.stack import FAST_CALLS, api_fleet, app_for, bearer, control_worker_seen, http_client
from tests.faults import TcpProxy
from tests.workflows.lab import Lab, running_lab
from workflows.allocation.client import workflow_id


@dataclass
class Faulty:
    """The API, its dependencies behind cuttable proxies, and a second, direct view of the database."""

    http: httpx.AsyncClient
    lab: Lab
    database: TcpProxy
    temporal: TcpProxy
    temporal_client: Client  # direct, not through the proxy
    acme: dict[str, str]
    admin: dict[str, str]
    proxied_client: Client  # the API's, through the Temporal proxy

    async def rows(self, **where: Any) -> list[AllocationRow]:
        async with self.lab.sessions() as session:
            query = select(AllocationRow).filter_by(**where)
            return list((await session.scalars(query)).all())

    async def wait_for(self, allocation_id: str, *states: str, timeout: float = 30) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            answer = await self.http.get(f"/v1/allocations/{allocation_id}", headers=self.admin)
            if answer.status_code == 200 and answer.json()["state"] in states:
                return answer.json()
            assert asyncio.get_running_loop().time() < deadline, f"{allocation_id}: {answer.status_code} {answer.text}"
            await asyncio.sleep(0.1)


@pytest.fixture
async def faulty(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[Faulty]:
    url = make_url(database_url)
    database = await TcpProxy(url.host or "127.0.0.1", url.port or 5432).start()
    host, _, port = temporal_client.service_client.config.target_host.rpartition(":")
    temporal = await TcpProxy(host, int(port)).start()
    engine = create_engine(url.set(port=database.port).render_as_string(hide_password=False), pool_size=3)
    proxied_client = await Client.connect(
        temporal.address, namespace=temporal_client.namespace, data_converter=pydantic_data_converter
    )
    try:
        async with running_lab(temporal_client, temporal_client, sessions, tmp_path, api_fleet()) as lab:
            async with sessions.begin() as session:
                admin = await create_token(session, "admin", label="tests")
                tokens = await ensure_tenant_tokens(session)
            app = app_for(session_factory(engine), proxied_client, lab.queues)
            await control_worker_seen(app)
            async with http_client(app) as http:
                yield Faulty(
                    http,
                    lab,
                    database,
                    temporal,
                    temporal_client,
                    bearer(tokens["acme"]),
                    bearer(admin),
                    proxied_client,
                )
    finally:
        await engine.dispose()
        await database.stop()
        await temporal.stop()


async def create_losing_the_database_after_the_start(faulty: Faulty, body: dict[str, Any], key: str) -> httpx.Response:
    """POST a create whose database connection is cut the moment Temporal has accepted the workflow's start: the
    fault lands exactly between the start and the row's write, where the reported duplicates came from."""
    control = faulty.http._transport.app.state.services.control  # type: ignore[attr-defined]
    real_start = control.start

    async def start_then_cut(*args: Any, **kwargs: Any) -> Any:
        result = await real_start(*args, **kwargs)
        await faulty.database.cut()
        return result

    control.start = start_then_cut
    try:
        return await faulty.http.post("/v1/allocations", json=body, headers=faulty.acme | {"Idempotency-Key": key})
    finally:
        control.start = real_start


async def test_database_lost_right_after_the_start_still_yields_one_allocation(faulty: Faulty) -> None:
    """The reported bug: the workflow had started, the row's commit failed, the client's retry made a second one."""
    key = {"Idempotency-Key": "order-66"}
    first = await create_losing_the_database_after_the_start(faulty, {"gpu_count": 2}, "order-66")
    # Temporal accepted the start: that is a 202 naming the allocation, although its row could not be written.
    assert first.status_code == 202, first.text
    allocation_id = first.json()["id"]
    assert allocation_id == keyed_allocation_id("acme", "order-66")

    # While PostgreSQL is unreachable a retry is a 503 naming it, not a second allocation.
    during = await faulty.http.post("/v1/allocations", json={"gpu_count": 2}, headers=faulty.acme | key)
    assert during.status_code == 503 and during.json()["error"]["code"] == "database_unavailable"

    await faulty.database.restore()
    again = await faulty.http.post("/v1/allocations", json={"gpu_count": 2}, headers=faulty.acme | key)
    assert again.status_code == 200 and again.json()["id"] == allocation_id
    active = await faulty.wait_for(allocation_id, "active")
    assert active["tenant"] == "acme"
    rows = await faulty.rows(tenant="acme")
    assert [(r.id, r.idempotency_key) for r in rows] == [(allocation_id, "order-66")]


async def test_a_key_reused_with_another_body_while_the_row_is_missing_is_409(faulty: Faulty) -> None:
    """The first request's row has not been written yet; the workflow's memo still tells the bodies apart."""
    key = {"Idempotency-Key": "order-67"}
    first = await create_losing_the_database_after_the_start(faulty, {"gpu_count": 1}, "order-67")
    assert first.status_code == 202
    # Written by nobody yet, and the workflow cannot write it either until PostgreSQL is back.
    async with faulty.lab.sessions() as session:
        count = await session.scalar(select(func.count()).select_from(AllocationRow))
    await faulty.database.restore()
    other = await faulty.http.post("/v1/allocations", json={"gpu_count": 4}, headers=faulty.acme | key)
    assert other.status_code == 409, other.text
    assert other.json()["error"]["code"] == "idempotency_conflict"
    assert other.json()["error"]["details"] == {"allocation_id": first.json()["id"]}
    assert count in (0, 1)  # the workflow's own write races this check; never two
    await faulty.http.post(f"/v1/allocations/{first.json()['id']}/cancel", headers=faulty.acme)


async def test_database_down_before_the_start_creates_nothing(faulty: Faulty) -> None:
    # A key no other test uses: the Temporal server is shared by the session, and `berth request` tests use "k1".
    key = f"outage-{uuid.uuid4()}"
    await faulty.database.cut()
    answer = await faulty.http.post(
        "/v1/allocations", json={"gpu_count": 2}, headers=faulty.acme | {"Idempotency-Key": key}
    )
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "database_unavailable"
    assert answer.headers["retry-after"]
    await faulty.database.restore()
    with pytest.raises(RPCError) as missing:
        await faulty.temporal_client.get_workflow_handle(workflow_id(keyed_allocation_id("acme", key))).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND
    assert await faulty.rows() == []


async def test_connections_reset_mid_pool_answer_503_then_recover(faulty: Faulty) -> None:
    """Pooled connections die with the server: asyncpg's errors, however SQLAlchemy wraps them, are a 503."""
    assert (await faulty.http.get("/v1/allocations", headers=faulty.admin)).status_code == 200
    await faulty.database.cut()
    for _ in range(3):  # a dead pooled connection, then refused new ones
        answer = await faulty.http.get("/v1/allocations", headers=faulty.admin)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "database_unavailable"
    await faulty.database.restore()
    assert (await faulty.http.get("/v1/allocations", headers=faulty.admin)).status_code == 200


async def test_temporal_down_is_temporal_unavailable_not_no_control_worker(faulty: Faulty) -> None:
    # The API has just seen the control worker (its answer is cached), so the outage shows first at the start.
    await faulty.temporal.cut()
    answer = await faulty.http.post(
        "/v1/allocations", json={"gpu_count": 2}, headers=faulty.acme | {"Idempotency-Key": "k2"}
    )
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "temporal_unavailable"
    assert await faulty.rows() == []
    await faulty.temporal.restore()
    retried = await faulty.http.post(
        "/v1/allocations", json={"gpu_count": 2}, headers=faulty.acme | {"Idempotency-Key": "k2"}
    )
    assert retried.status_code in (200, 202), retried.text
    await faulty.wait_for(retried.json()["id"], "active")
    assert len(await faulty.rows(tenant="acme")) == 1


def _control_workers(metrics: httpx.Response) -> float:
    assert metrics.status_code == 200, metrics.text
    line = next(line for line in metrics.text.splitlines() if line.startswith("berth_control_workers "))
    return float(line.split()[1])


async def test_a_temporal_too_loaded_to_answer_does_not_hide_a_worker_it_just_reported(faulty: Faulty) -> None:
    """A loaded server may drop the worker check (its deadline passes, or it answers "operation was canceled"); a
    worker it reported within the poller freshness window still counts, as the server's own answer would count it.
    Nothing listening at all is still "Temporal does not answer" (-1)."""
    assert _control_workers(await faulty.http.get("/metrics", headers=faulty.admin)) == 1
    await asyncio.sleep(FAST_CALLS.worker_cache_seconds)  # the next check asks the server again
    faulty.temporal.stall()
    try:
        assert _control_workers(await faulty.http.get("/metrics", headers=faulty.admin)) == 1
    finally:
        faulty.temporal.flow()
    never_saw_one = app_for(faulty.lab.sessions, faulty.proxied_client, faulty.lab.queues)
    faulty.temporal.stall()
    try:
        async with http_client(never_saw_one) as http:
            assert _control_workers(await http.get("/metrics", headers=faulty.admin)) == -1
    finally:
        faulty.temporal.flow()
    await faulty.temporal.cut()
    try:
        await asyncio.sleep(FAST_CALLS.worker_cache_seconds)
        assert _control_workers(await faulty.http.get("/metrics", headers=faulty.admin)) == -1
    finally:
        await faulty.temporal.restore()


def test_outages_are_told_apart_from_bugs() -> None:
    """asyncpg's InternalClientError (a connection cut mid-protocol), as SQLAlchemy wraps it, is an outage; a
    statement PostgreSQL rejects is not."""
    cut = InternalError("SELECT 1", {}, asyncpg.exceptions.InternalClientError("unexpected connection state"))
    assert is_database_outage(cut)
    shutdown = InternalError("SELECT 1", {}, asyncpg.exceptions.AdminShutdownError("terminating connection"))
    assert is_database_outage(shutdown)
    syntax = ProgrammingError("SELEC 1", {}, asyncpg.exceptions.PostgresSyntaxError("syntax error"))
    assert not is_database_outage(syntax)
