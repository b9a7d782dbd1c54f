"""Fixtures of the API tests (see stack.py for the lab they run against)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from tests.api.stack import Stack, api_fleet, running_stack


@pytest.fixture
async def stack(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> AsyncIterator[Stack]:
    async with running_stack(temporal_client, sessions, tmp_path, api_fleet()) as stack:
        yield stack
