"""What the console's browser tests share: one live stack per test module (the real API with its console, a control
worker and simulated node agents, over real HTTP, signing people in with the test OIDC provider), one Chromium per
module (Debian's, driven by Playwright, which never downloads a browser here), and the helpers that sign a person in
the way they would: in the browser, through the provider's own page."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, async_playwright
from temporalio.testing import WorkflowEnvironment

from devstack.postgres import EmbeddedPostgres
from tests.api.served import Served, served_api
from tests.api.stack import api_fleet
from tests.console.browsing import TEMPORAL_UI
from tests.identity.provider import CLIENT_ID, CLIENT_SECRET, Provider, running_provider
from tests.workflows.allocation.test_ui_page import CHROMIUM, FLAGS

# Who is who at the provider: groups and the API's grants for them (the console adds no rule of its own).
ROLES = {
    "acme-ml": ["member:acme"],
    "acme-watchers": ["viewer:acme"],
    "globex-ml": ["member:globex"],
    "platform": ["admin"],
}
_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[Provider]:
    """The company's identity provider, as far as Berth can tell: a real OIDC provider process."""
    with running_provider() as provider:
        yield provider


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium, started as the Temporal UI's test starts it, one for the module. Missing where the README's
    test command would have installed it (root, apt: as CI runs), it fails; elsewhere the module skips, loudly."""
    if CHROMIUM is None:
        installable = os.geteuid() == 0 and shutil.which("apt-get") is not None
        why = "chromium is missing: the README's test command installs it (scripts/test-prerequisites.sh)"
        if installable:
            pytest.fail(why, pytrace=False)
        pytest.skip(f"LOUD: {why}, which this machine cannot (not root, or no apt): the console's tests did NOT run")
    async with (
        async_playwright() as playwright,
        await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS) as launched,
    ):
        yield launched


@pytest.fixture(scope="module")
async def module_database(postgres: EmbeddedPostgres, migrated_template: str) -> AsyncIterator[str]:
    """A fresh, migrated database for the whole module (its one stack), dropped at its end."""
    name = f"console_{next(_numbers)}"
    server = {"host": "127.0.0.1", "port": postgres.port, "user": "postgres", "database": "postgres"}
    connection = await asyncpg.connect(**server)
    try:
        await connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}" STRATEGY FILE_COPY')
        yield postgres.url.rsplit("/", 1)[0] + f"/{name}"
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


@pytest.fixture(scope="module")
def live(
    module_database: str,
    temporal_env: WorkflowEnvironment,
    oidc_provider: Provider,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """The API and its console over real HTTP on the lab fleet (tests/api/stack.py), people signing in with the
    provider (the console's redirect URI is <api>/console/auth/callback, which the provider takes)."""
    temporal = temporal_env.client
    people = {
        "oidc_issuer_url": oidc_provider.issuer,
        "oidc_client_id": CLIENT_ID,
        "oidc_client_secret": CLIENT_SECRET,
        "oidc_roles": ROLES,
        "temporal_ui_url": TEMPORAL_UI,
    }
    address, namespace = temporal.service_client.config.target_host, temporal.namespace
    home = tmp_path_factory.mktemp("console-lab")
    with served_api(module_database, address, namespace, api_fleet(), home, **people) as served:
        until_polled(served.base_url)
        yield served


def until_polled(base_url: str, seconds: float = 10) -> None:
    """The API acts only once its control worker polls: wait for /healthz to say so."""
    deadline = time.monotonic() + seconds
    while not httpx.get(f"{base_url}/healthz").json()["control_workers"]:
        assert time.monotonic() < deadline, "the lab's control worker never polled"
        time.sleep(0.05)
