"""Fixtures of the API tests (see stack.py for the lab they run against)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from store.tokens import create_token, ensure_tenant_tokens
from tests.api.stack import Stack, api_fleet, app_for, bearer, control_worker_seen, http_client
from tests.workflows.lab import running_lab


@pytest.fixture
async def stack(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> AsyncIterator[Stack]:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, api_fleet()) as lab:
        async with sessions.begin() as session:
            admin = await create_token(session, "admin", label="tests")
            tenant_tokens = await ensure_tenant_tokens(session)
        app = app_for(sessions, temporal_client, lab.queues)
        await control_worker_seen(app)
        async with http_client(app) as http:
            yield Stack(http, lab, bearer(admin), bearer(tenant_tokens["acme"]), bearer(tenant_tokens["globex"]))
