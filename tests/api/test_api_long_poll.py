"""Long polls (api/long_poll.py) against the real stack: a GET with `wait_for` answers once the object reaches one of
the states asked for, or a final state, or at its `timeout` with the state it still has; the caller reads the state.
Unknown states and bad timeouts are 422s; an object the caller cannot see is the usual 404, at once; and a waiting
request holds no database connection while it waits."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from temporalio.client import Client

from api.app import create_app
from config.settings import Settings
from contracts.allocation import FINAL_STATES
from tests.api.stack import FAST_CALLS, Stack, http_client


async def test_a_wait_returns_when_the_allocation_reaches_the_state(stack: Stack) -> None:
    allocation = await stack.create(2)  # `small`: active in about a second
    response = await stack.http.get(
        f"/v1/allocations/{allocation}", params={"wait_for": "active", "timeout": "60s"}, headers=stack.acme
    )
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "active"

    # Repeated and comma-separated forms; a state it is already in answers at once.
    response = await stack.http.get(
        f"/v1/allocations/{allocation}?wait_for=failed&wait_for=degraded,active&timeout=60s", headers=stack.acme
    )
    assert response.status_code == 200 and response.json()["state"] == "active"


async def test_a_wait_returns_at_its_timeout_with_the_state_it_still_has(stack: Stack) -> None:
    allocation = await stack.create(1)  # `slow` never boots: it stays waiting_ready
    await stack.wait_for(allocation, "waiting_ready")
    started = time.monotonic()
    response = await stack.http.get(
        f"/v1/allocations/{allocation}", params={"wait_for": "active", "timeout": "1s"}, headers=stack.acme
    )
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "waiting_ready"
    assert time.monotonic() - started >= 0.9  # it waited for its timeout, not answered at once


async def test_a_wait_ends_at_a_final_state_it_did_not_ask_for(stack: Stack) -> None:
    allocation = await stack.create(1)
    await stack.wait_for(allocation, "waiting_ready")
    waiting = asyncio.create_task(
        stack.http.get(f"/v1/allocations/{allocation}?wait_for=active&timeout=60s", headers=stack.acme)
    )
    await asyncio.sleep(0.5)
    assert not waiting.done()  # still waiting: it is not active
    cancelled = await stack.http.post(f"/v1/allocations/{allocation}/cancel", headers=stack.acme)
    assert cancelled.status_code == 202, cancelled.text
    response = await asyncio.wait_for(waiting, 50)  # well before its 60 s
    assert response.status_code == 200 and response.json()["state"] in FINAL_STATES


async def test_bad_waits_are_refused_and_unseen_objects_are_404_at_once(stack: Stack) -> None:
    allocation = await stack.create(2)
    url = f"/v1/allocations/{allocation}"
    for params, field in (
        ({"wait_for": "running"}, "query.wait_for"),
        ({"wait_for": ","}, "query.wait_for"),
        ({"wait_for": "active", "timeout": "2m"}, "query.timeout"),
        ({"wait_for": "active", "timeout": "5"}, "query.timeout"),
    ):
        response = await stack.http.get(url, params=params, headers=stack.acme)
        assert response.status_code == 422, (params, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and error["details"][0]["field"] == field, error
    unknown = (await stack.http.get(url, params={"wait_for": "running"}, headers=stack.acme)).json()["error"]
    assert "'running': the states are pending, queued" in unknown["message"]

    # Another tenant's allocation, or none: the GET's own 404, without waiting.
    for path, who in ((url, stack.globex), ("/v1/allocations/nosuch", stack.acme)):
        started = time.monotonic()
        response = await stack.http.get(path, params={"wait_for": "released", "timeout": "30s"}, headers=who)
        assert response.status_code == 404 and time.monotonic() - started < 20


async def test_a_reservation_can_be_waited_for(stack: Stack) -> None:
    starts = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    created = await stack.http.post(
        "/v1/reservations",
        json={"gpu_count": 1, "region": "lab", "starts_at": starts, "duration": "1h"},
        headers=stack.acme,
    )
    assert created.status_code == 201, created.text
    url = f"/v1/reservations/{created.json()['id']}"

    started = time.monotonic()
    response = await stack.http.get(url, params={"wait_for": "started", "timeout": "1s"}, headers=stack.acme)
    assert response.status_code == 200 and response.json()["state"] == "reserved"  # its timeout: still reserved
    assert time.monotonic() - started >= 0.9
    bad = await stack.http.get(url, params={"wait_for": "active"}, headers=stack.acme)
    assert bad.status_code == 422 and "the states are reserved, started" in bad.json()["error"]["message"]

    waiting = asyncio.create_task(
        stack.http.get(url, params={"wait_for": "started", "timeout": "60s"}, headers=stack.acme)
    )
    assert (await stack.http.delete(url, headers=stack.acme)).status_code == 202
    response = await asyncio.wait_for(waiting, 50)
    assert response.status_code == 200 and response.json()["state"] == "cancelled"  # final: the wait is over


async def test_waiting_requests_hold_no_database_connection(
    stack: Stack, temporal_client: Client, database_url: str
) -> None:
    """An API with a single database connection: five waits and a plain read all answer, side by side, in about the
    time of one wait. Were a wait to hold its connection while it sleeps, they would answer one after another."""
    allocation = await stack.create(1)
    await stack.wait_for(allocation, "waiting_ready")
    single = create_async_engine(database_url, pool_size=1, max_overflow=0)  # one connection, no more
    sessions = async_sessionmaker(single, expire_on_commit=False)
    app = create_app(
        Settings(), sessions=sessions, temporal=temporal_client, queues=stack.lab.queues, timeouts=FAST_CALLS
    )
    try:
        async with http_client(app) as http:
            url = f"/v1/allocations/{allocation}"
            started = time.monotonic()
            waits = [
                http.get(url, params={"wait_for": "active", "timeout": "3s"}, headers=stack.acme) for _ in range(5)
            ]
            answers = await asyncio.gather(*waits, http.get(url, headers=stack.acme))
            elapsed = time.monotonic() - started
        assert [a.status_code for a in answers] == [200] * 6
        assert elapsed < 12, f"five 3-second waits took {elapsed:.1f}s on one connection: they held it while waiting"
    finally:
        await single.dispose()
