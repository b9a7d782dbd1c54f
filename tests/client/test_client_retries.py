"""Retries against the live stack, through a fault-injecting transport wrapped around httpx's real one: a create
whose answer is lost after the API carried it out makes one allocation, not two; Retry-After is waited out; what is
not safe to send twice is not sent twice."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

import berth
from tests.client.conftest import Live


class Faulty(httpx.BaseTransport):
    """The real transport, but for requests `hit` picks: `lose` sends them and drops the answer (the API did the
    work), else they are answered 429 with Retry-After without reaching the API. `seen`: every request's method,
    path, Idempotency-Key and the monotonic time it was sent."""

    def __init__(self, hit: Callable[[httpx.Request], bool], *, lose: int = 0, throttle: int = 0) -> None:
        self.real, self.hit, self.lose, self.throttle = httpx.HTTPTransport(), hit, lose, throttle
        self.seen: list[tuple[str, str, str | None, float]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path, request.headers.get("idempotency-key"), time.monotonic()))
        if self.hit(request) and self.throttle:
            self.throttle -= 1
            body = {"error": {"code": "rate_limited", "message": "slow down", "details": None}}
            return httpx.Response(429, headers={"Retry-After": "1"}, content=json.dumps(body).encode())
        response = self.real.handle_request(request)
        if self.hit(request) and self.lose:
            self.lose -= 1
            response.read()
            response.close()
            raise httpx.ReadError("the answer was lost", request=request)
        return response

    def close(self) -> None:
        self.real.close()


def creates(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path in ("/v1/allocations", "/v1/reservations")


def test_a_create_whose_answer_was_lost_is_retried_into_the_same_allocation(live: Live) -> None:
    faulty = Faulty(creates, lose=1)
    with berth.Client(tenant="acme", transport=faulty) as client:
        accepted = client.allocations.create(gpus=2, duration="1h")
        sent = [(method, key) for method, path, key, _ in faulty.seen if path == "/v1/allocations"]
        assert len(sent) == 2 and sent[0] == sent[1] and sent[0][1]  # sent twice, with one Idempotency-Key
        assert [a.id for a in client.allocations.list()] == [accepted.id]
        client.allocations.wait(accepted.id)
        client.allocations.release(accepted.id)


def test_a_create_without_an_idempotency_key_is_never_sent_twice(live: Live) -> None:
    faulty = Faulty(creates, lose=1)
    starts = datetime.now(UTC) + timedelta(hours=2)
    with berth.Client(tenant="acme", transport=faulty) as client:
        with pytest.raises(berth.Unreachable):
            client.reservations.create(gpu_count=1, region="lab", starts_at=starts, duration="1h")
        assert len([path for _, path, _, _ in faulty.seen if path == "/v1/reservations"]) == 1
        assert len(list(client.reservations.list())) == 1  # the API made it; the client did not make a second


def test_retry_after_is_waited_out_and_the_attempts_are_bounded(live: Live) -> None:
    faulty = Faulty(lambda request: request.url.path == "/v1/whoami", throttle=1)
    with berth.Client(transport=faulty) as client:
        assert client.whoami().role == "admin"
    (_, _, _, first), (_, _, _, second) = faulty.seen
    assert second - first >= 1.0  # Retry-After: 1

    always = Faulty(lambda request: request.url.path == "/v1/whoami", throttle=10)
    retries = berth.Retries(attempts=2, total=30)
    with berth.Client(transport=always, retries=retries) as client, pytest.raises(berth.RateLimited) as limited:
        client.whoami()
    assert (limited.value.code, limited.value.status, len(always.seen)) == ("rate_limited", 429, 2)

    # A Retry-After longer than what is left of the total is not waited for: the error comes at once.
    short = Faulty(lambda request: request.url.path == "/v1/whoami", throttle=10)
    with berth.Client(transport=short, retries=berth.Retries(total=0.5)) as client, pytest.raises(berth.RateLimited):
        client.whoami()
    assert len(short.seen) == 1


def test_an_unreachable_api_is_one_error(live: Live) -> None:
    with berth.Client("http://127.0.0.1:9", "x", retries=berth.Retries(attempts=2, backoff=0.01)) as client:
        with pytest.raises(berth.Unreachable) as unreachable:
            client.health()
    assert unreachable.value.status is None and unreachable.value.code == "unreachable"


def test_an_allocate_whose_create_got_no_answer_leaves_nothing_behind(live: Live) -> None:
    """The create reached the API but its answer never came (and the client does not retry): allocate() raises, and
    the allocation the API made anyway is found again by its Idempotency-Key and given back, not left holding GPUs."""
    faulty = Faulty(creates, lose=1)
    with berth.Client(tenant="acme", transport=faulty, retries=berth.Retries(attempts=1)) as client:
        with pytest.raises(berth.Unreachable):
            with client.allocate(gpus=2, duration="1h"):
                pytest.fail("the block must not run: no allocation was ever confirmed")
        sent = [key for method, path, key, _ in faulty.seen if (method, path) == ("POST", "/v1/allocations")]
        assert len(sent) == 2 and sent[0] == sent[1]  # the same create again, to learn its id
        [made] = list(client.allocations.list())
        assert client.allocations.wait(made.id, "cancelled", "released", timeout=60).state in ("cancelled", "released")


def test_odd_answers_never_hang_the_client() -> None:
    """A Retry-After that is no number of seconds (`nan`) is no delay to wait; a page cursor given twice is refused
    instead of paging forever (an API answering in a loop, a proxy's bug)."""
    assert berth._http.retry_after(httpx.Response(503, headers={"Retry-After": "nan"})) is None
    assert berth._http.retry_after(httpx.Response(503, headers={"Retry-After": "inf"})) is None
    assert berth._http.retry_after(httpx.Response(503, headers={"Retry-After": "2"})) == 2.0

    def same_cursor(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"allocations": [], "next_cursor": "again"})

    with berth.Client("http://berth.test", "t", transport=httpx.MockTransport(same_cursor)) as client:
        with pytest.raises(berth.BerthError) as looped:
            list(client.allocations.list())
    assert looped.value.code == "unexpected_answer"
