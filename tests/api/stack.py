"""Helpers for the API tests: the API against a real stack (PostgreSQL, the Temporal dev server, a control worker
and real node-agent workers with simulated hosts, from the workflow lab), called through httpx as any client would.

The lab fleet has three hosts in one slice pool, so each test can pick its scenario by GPU count:
- `slow` (1 GPU) never boots: a 1-GPU request stays `waiting_ready` there until retried or cancelled;
- `small` (2 GPUs) is where best fit puts a 2-GPU request, which becomes active in about a second;
- `big` (4 GPUs) takes a 4-GPU request.
Tenants: `acme` (the lab's) and `globex` (quota 2). PriorityClasses: `spot` (preemptible, a 1s grace period) and
`urgent` (100); a request naming none has priority 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from api.app import create_app
from api.errors import ApiError
from api.temporal import TemporalTimeouts
from config.settings import Settings
from contracts.allocation import FINAL_STATES
from contracts.task_queues import Queues
from store.tokens import create_token, ensure_tenant_tokens
from tests.workflows.lab import FAST, Lab, lab_fleet, running_lab

HOSTS = {"slow": {"gpus": 1, "simulation": {"bootSeconds": 3600}}, "small": {"gpus": 2}, "big": {"gpus": 4}}
GLOBEX = {"apiVersion": "berth.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "globex"}, "spec": {"gpuQuota": 2}}
FAST_CALLS = TemporalTimeouts(call_seconds=3.0, status_seconds=1.0, worker_cache_seconds=0.5)


CLASSES = [
    {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "spot"},
        "spec": {"value": 0, "preemptible": True, "gracePeriod": "1s"},
    },
    {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "urgent"},
        "spec": {"value": 100},
    },
]


def api_fleet() -> str:
    return lab_fleet(HOSTS) + "---\n" + yaml.safe_dump_all([GLOBEX, *CLASSES], sort_keys=False)


def app_for(
    sessions: async_sessionmaker[AsyncSession],
    temporal: Client | None,
    queues: Queues,
    timeouts: TemporalTimeouts = FAST_CALLS,
    traced: bool | None = None,
    **settings: Any,
) -> FastAPI:
    return create_app(
        Settings(**settings),
        sessions=sessions,
        temporal=temporal,
        queues=queues,
        timing=FAST,
        timeouts=timeouts,
        traced=traced,
    )


async def control_worker_seen(app: FastAPI, timeout: float = 10) -> None:
    """A worker that has just started takes a moment to poll; the API refuses to act until it has. A loaded Temporal
    dev server may also drop one describe call ("operation was canceled", a 503 the API's clients retry): that too
    is "not yet", until the deadline."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            if await app.state.services.control.control_workers() > 0:
                return
            why = "the lab's control worker never polled"
        except ApiError as error:
            if error.status != 503:
                raise
            why = f"Temporal never answered whether the control worker polls: {error.message}"
        assert asyncio.get_running_loop().time() < deadline, why
        await asyncio.sleep(0.05)


def http_client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://berth.test")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Stack:
    http: httpx.AsyncClient
    lab: Lab
    admin: dict[str, str]  # headers
    acme: dict[str, str]
    globex: dict[str, str]

    async def create(self, gpus: int, who: dict[str, str] | None = None, **body: Any) -> str:
        response = await self.http.post("/v1/allocations", json={"gpu_count": gpus, **body}, headers=who or self.acme)
        assert response.status_code == 202, response.text
        return response.json()["id"]

    async def get(self, allocation_id: str, who: dict[str, str] | None = None) -> dict[str, Any]:
        response = await self.http.get(f"/v1/allocations/{allocation_id}", headers=who or self.admin)
        assert response.status_code == 200, response.text
        return response.json()

    async def wait_for(self, allocation_id: str, *states: str, timeout: float = 30) -> dict[str, Any]:
        """Poll the API, as a client would, until the allocation is in one of `states`; a final state once it is
        recorded (the workflow's own status says `released` a moment before its last trail write lands)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            allocation = await self.get(allocation_id)
            recorded = allocation["state"] not in FINAL_STATES or not allocation["live"]
            if allocation["state"] in states and recorded:
                return allocation
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{allocation_id} stayed {allocation['state']} (wanted {states}): {allocation}")
            await asyncio.sleep(0.1)


@asynccontextmanager
async def running_stack(
    temporal: Client, sessions: async_sessionmaker[AsyncSession], home: Path, fleet: str, **app: Any
) -> AsyncIterator[Stack]:
    """The API over a lab of `fleet` (api_fleet() for the `stack` fixture), with an admin and each tenant's token;
    `app`: create_app's options (`traced=True`, say)."""
    async with running_lab(temporal, temporal, sessions, home, fleet) as lab:
        async with sessions.begin() as session:
            admin = await create_token(session, "admin", label="tests")
            tenant_tokens = await ensure_tenant_tokens(session)
        api = app_for(sessions, temporal, lab.queues, **app)
        await control_worker_seen(api)
        async with http_client(api) as http:
            tenants = {name: bearer(token) for name, token in tenant_tokens.items()}
            yield Stack(http, lab, bearer(admin), tenants.get("acme", {}), tenants.get("globex", {}))
