"""Request bodies are bounded before they are read, and their senders authenticated before they are parsed
(api/body_limit.py): a 100 MB `POST /v1/allocations` without a token is refused 401 before a byte of it is read.

The API runs on the real stack with small limits (4 KiB for most routes, 32 KiB for manifests and reports). Where
a test must show that a body was not read, it streams the body from a generator through httpx's ASGI transport and
counts the chunks the API pulled: the API asks for each chunk itself, so the count is exactly what it read. Where it
must show that the server did not wait for a body, it speaks HTTP over a socket to uvicorn and sends none.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from store.tokens import create_token, ensure_tenant_tokens
from tests.api.stack import api_fleet, app_for, bearer, control_worker_seen, http_client
from tests.workflows.lab import running_lab

LIMIT = 4096
MANIFEST_LIMIT = 32 * 1024
CHUNK = 1024


@dataclass
class Limited:
    app: FastAPI
    http: httpx.AsyncClient  # in-process (ASGI), to count what the API reads
    port: int  # uvicorn on 127.0.0.1, for what only a real connection shows
    admin: dict[str, str]
    acme: dict[str, str]


@pytest.fixture
async def limited(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> AsyncIterator[Limited]:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, api_fleet()) as lab:
        async with sessions.begin() as session:
            admin = await create_token(session, "admin", label="tests")
            tenants = await ensure_tenant_tokens(session)
        app = app_for(
            sessions,
            temporal_client,
            lab.queues,
            api_max_body_bytes=LIMIT,
            api_max_manifest_bytes=MANIFEST_LIMIT,
            api_max_report_bytes=MANIFEST_LIMIT,
        )
        await control_worker_seen(app)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        try:
            while not server.started:
                await asyncio.sleep(0.02)
            async with http_client(app) as http:
                yield Limited(app, http, listener.getsockname()[1], bearer(admin), bearer(tenants["acme"]))
        finally:
            server.should_exit = True
            await serving
            listener.close()


class Counted:
    """A request body streamed in chunks (no Content-Length: httpx sends it chunked), counting those pulled."""

    def __init__(self, total: int, chunk: bytes = b"x" * CHUNK) -> None:
        self.chunks = [chunk] * (total // len(chunk))
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.pulled += 1
            yield chunk


def _refused_too_large(response: httpx.Response, limit: int) -> None:
    assert response.status_code == 413, response.text
    assert response.json()["error"] == {
        "code": "payload_too_large",
        "message": f"the request body is larger than this route's limit of {limit} bytes",
        "details": {"limit_bytes": limit},
    }


async def _exchange(port: int, head: str) -> tuple[str, dict[str, object]]:
    """Send a request head (and no body) over a socket; the status line and the JSON body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode())
        await writer.drain()
        # A server that waited for the announced body would never answer: the bound only turns a hang into a failure.
        answer = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
    status, _, rest = answer.decode().partition("\r\n")
    return status, json.loads(rest.partition("\r\n\r\n")[2])


async def test_a_declared_length_over_the_limit_is_refused_without_waiting_for_the_body(limited: Limited) -> None:
    head = (
        "POST /v1/allocations HTTP/1.1\r\nHost: berth.test\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000000\r\nConnection: close\r\n\r\n"
    )
    status, body = await _exchange(limited.port, head)  # 100 MB announced, not a byte of it sent
    assert status == "HTTP/1.1 413 Request Entity Too Large"
    assert body["error"]["code"] == "payload_too_large" and body["error"]["details"] == {"limit_bytes": LIMIT}

    # The same in process: the API pulls no chunk of a body whose announced length is over the limit.
    counted = Counted(8 * LIMIT)
    headers = limited.acme | {"Content-Length": str(8 * LIMIT)}
    _refused_too_large(await limited.http.post("/v1/allocations", content=counted, headers=headers), LIMIT)
    assert counted.pulled == 0


@pytest.mark.parametrize(
    ("method", "path", "who", "limit"),
    [
        ("POST", "/v1/allocations", "acme", LIMIT),  # parsed by FastAPI before the route runs
        ("PUT", "/v1/fleet", "admin", MANIFEST_LIMIT),  # read by the route itself
        ("POST", "/v1/nodes/small/report", "admin", MANIFEST_LIMIT),  # read before routing (api/steady_reports.py)
    ],
)
async def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(
    limited: Limited, method: str, path: str, who: str, limit: int
) -> None:
    counted = Counted(64 * limit)
    headers = getattr(limited, who) | {"Content-Type": "application/json"}
    response = await limited.http.request(method, path, content=counted, headers=headers)
    _refused_too_large(response, limit)
    assert counted.pulled == limit // CHUNK + 1  # read up to the chunk that passed the limit, and not one more


@pytest.mark.parametrize("token", [None, "berth_not_a_token"])
async def test_a_body_without_a_valid_token_is_refused_before_it_is_read(limited: Limited, token: str | None) -> None:
    counted = Counted(2 * CHUNK, chunk=b"{not json" + b" " * (CHUNK - 9))  # under the limit, and not JSON
    headers = {"Content-Type": "application/json", **(bearer(token) if token else {})}
    response = await limited.http.post("/v1/allocations", content=counted, headers=headers)
    # 401, not the 422 a body that does not parse would get: the body was never parsed, nor even read.
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == ("invalid_token" if token else "unauthenticated")
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert counted.pulled == 0
    declared = await limited.http.post("/v1/explain", content=b"{not json", headers=headers)
    assert declared.status_code == 401, declared.text


async def test_bodies_under_their_limits_are_served_as_before(limited: Limited) -> None:
    base = f"http://127.0.0.1:{limited.port}"
    async with httpx.AsyncClient(base_url=base) as http:
        created = await http.post("/v1/allocations", json={"gpu_count": 2}, headers=limited.acme)
        assert created.status_code == 202, created.text
        # A fleet file may be larger than an allocation request: this one is over the default limit.
        fleet = api_fleet() + "".join(f"# padding line {i:05d}\n" for i in range(LIMIT // 16))
        assert LIMIT < len(fleet) < MANIFEST_LIMIT
        applied = await http.put(
            "/v1/fleet", content=fleet, headers=limited.admin | {"Content-Type": "application/yaml"}
        )
        assert applied.status_code == 200, applied.text
        malformed = await http.post("/v1/allocations", content=b"{not json", headers=limited.acme)
        assert malformed.status_code == 422  # a valid token's body is parsed and judged as before
    schema = limited.app.openapi()
    with_body = [
        (path, method)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if "requestBody" in operation
    ]
    assert ("/v1/allocations", "post") in with_body and ("/v1/fleet", "put") in with_body
    assert all("413" in schema["paths"][path][method]["responses"] for path, method in with_body)
