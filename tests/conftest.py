"""Session-scoped real services for the tests: an embedded PostgreSQL and a Temporal dev server, one of each per
pytest-xdist worker (the suite runs on two), so the workers share nothing but the machine.

Each test that touches the database gets its own database, cloned from a migrated template (a file copy inside
PostgreSQL, a few tens of milliseconds), so tests never see each other's rows. Temporal tests use unique task
queues and workflow ids on the one shared server.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from devstack.postgres import EmbeddedPostgres
from devstack.temporal import dev_server_dynamic_config, temporal_binary
from store.db import create_engine, session_factory
from store.migrate import upgrade
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES

# The CLI's console reads its width once, at import (cli/output.py), so the width the CLI tests' terminals ask for
# (COLUMNS=200, their CliRunner env) holds only if it is set before any test imports the CLI: set here for the whole
# run. Otherwise a test's tables would be as wide as whichever import came first, and pytest-xdist's workers inherit
# COLUMNS=80 from the controller besides.
os.environ["COLUMNS"] = "200"

# tests/child_crashes.py: a process a test started that crashed (SIGSEGV, SIGABRT, ...) fails that test, unless the
# test sent the signal itself. pytester lets that plugin's own test run tests in a pytest of their own.
pytest_plugins = ["tests.child_crashes", "pytester"]

TEMPLATE = "berth_template"
_database_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("postgres") / "data", durable=False).start()
    try:
        yield server
    finally:
        server.destroy()


def _url(server: EmbeddedPostgres, database: str) -> str:
    return server.url.rsplit("/", 1)[0] + f"/{database}"


async def _admin(server: EmbeddedPostgres, statement: str) -> None:
    connection = await asyncpg.connect(host="127.0.0.1", port=server.port, user="postgres", database="postgres")
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture(scope="session")
async def migrated_template(postgres: EmbeddedPostgres) -> str:
    await _admin(postgres, f'CREATE DATABASE "{TEMPLATE}"')
    engine = create_engine(_url(postgres, TEMPLATE))
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()
    return TEMPLATE


@pytest.fixture
async def empty_database_url(postgres: EmbeddedPostgres) -> AsyncIterator[str]:
    """A brand-new database with no schema at all."""
    name = f"empty_{next(_database_numbers)}"
    await _admin(postgres, f'CREATE DATABASE "{name}"')
    yield _url(postgres, name)
    await _drop(postgres, name)


@pytest.fixture
async def database_url(postgres: EmbeddedPostgres, migrated_template: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone."""
    name = f"test_{next(_database_numbers)}"
    # FILE_COPY copies the template's files rather than writing every page of it to the WAL (PostgreSQL's default
    # since 15): with fsync off it costs half as much, and a run creates some 650 of these.
    await _admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}" STRATEGY FILE_COPY')
    yield _url(postgres, name)
    await _drop(postgres, name)


async def _drop(server: EmbeddedPostgres, database: str) -> None:
    """Drop a test's database when the test is done. Some 650 are made per run: left in place, the session's end
    spent 20 to 30 s per worker deleting their files, where a drop while they are still cached costs about 9 ms.
    FORCE ends any connection a test's processes left behind."""
    await _admin(server, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, pool_size=5)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return session_factory(engine)


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """One dev server for the session, with per-workflow time skipping available (docs/design.md, "Temporal practice"). Workflows
    started through `temporal_env.client` skip timers; those started through `temporal_client` run in real time."""
    env = await WorkflowEnvironment.start_time_skipping_v2(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=[
            *dev_server_dynamic_config(),
            "--dynamic-config-value",
            "frontend.WorkflowTimeSkippingEnabled=true",
        ],
        ip="127.0.0.1",
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
async def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    """A plain client to the session's server: workflows it starts run in real time."""
    return await Client.connect(
        temporal_env.client.service_client.config.target_host,
        namespace=temporal_env.client.namespace,
        data_converter=pydantic_data_converter,
    )


@pytest.fixture
def examples_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "examples"
