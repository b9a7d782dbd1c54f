"""The console's edges, against the real API in-process: what a person may type or a proxy may add never ends in a
500, and a console behind a proxy that ended TLS takes its own pages' forms."""

from __future__ import annotations

import httpx

from tests.api import conftest as api_fixtures
from tests.api.stack import Stack
from tests.console.test_fleet_pages import csrf, signed_in

stack = api_fixtures.stack  # the API over the lab's three hosts, as tests/api has it


async def test_a_token_form_with_nothing_usable_asks_again(stack: Stack) -> None:
    async with httpx.AsyncClient(transport=stack.http._transport, base_url="http://berth.test") as http:  # noqa: SLF001
        for token in ("", "   ", "bérth_not-ascii", "berth_\x00"):
            answer = await http.post("/console/login/token", data={"token": token, "next": "/console/fleet"})
            assert answer.status_code == 303 and "problem=" in answer.headers["location"], (token, answer.text)
            assert "berth_console=" not in answer.headers.get("set-cookie", "")


async def test_dates_out_of_any_window_are_told_not_overflowed(stack: Stack) -> None:
    async with signed_in(stack.http, stack.admin) as admin:
        for path in (
            "/console/reservations?to=9999-12-31",
            "/console/reservations?from=9999-12-30",
            "/console/usage?from=0001-01-01",
        ):
            answer = await admin.get(path)
            assert answer.status_code == 200 and "outside the years" in answer.text, (path, answer.text[:300])


async def test_behind_a_proxy_that_ended_tls_the_forms_are_taken_and_the_cookie_is_secure(stack: Stack) -> None:
    """An ingress ends TLS and passes X-Forwarded-Proto: the browser's Origin is https, the request plain HTTP."""
    proxied = {"X-Forwarded-Proto": "https"}
    async with httpx.AsyncClient(
        transport=stack.http._transport,
        base_url="http://berth.test",
        headers=proxied,  # noqa: SLF001
    ) as http:
        token = stack.admin["Authorization"].removeprefix("Bearer ")
        signed = await http.post(
            "/console/login/token",
            data={"token": token, "next": "/console/fleet"},
            headers={"Origin": "https://berth.test"},
        )
        assert signed.status_code == 303 and signed.headers["location"] == "/console/fleet", signed.text
        cookie = signed.headers["set-cookie"]
        assert "secure" in cookie.lower()
        # The browser sends a Secure cookie back over https; this client speaks plain HTTP to the app, as the proxy
        # does, so it sends the cookie itself.
        session = {"Cookie": cookie.split(";", 1)[0]}
        confirm = await http.get("/console/nodes/big/cordon", headers=session)
        done = await http.post(
            "/console/nodes/big/cordon",
            data={"csrf": csrf(confirm.text)},
            headers=session | {"Origin": "https://berth.test"},
        )
        assert done.status_code == 303, done.text
        foreign = await http.post(
            "/console/nodes/big/uncordon",
            data={"csrf": csrf(confirm.text)},
            headers=session | {"Origin": "https://evil.test"},
        )
        assert foreign.status_code == 403
    assert (await stack.http.get("/v1/nodes/big", headers=stack.admin)).json()["status"] == "CORDONED"
