"""Fixtures of the CLI's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.api.served import Served, served_alone


@pytest.fixture
def fleet_api(database_url: str, temporal_env: WorkflowEnvironment) -> Iterator[Served]:
    """The API alone on a migrated database that holds no fleet: what `berth apply` and `berth tokens` talk to."""
    config = temporal_env.client.service_client.config
    with served_alone(database_url, config.target_host, temporal_env.client.namespace) as served:
        yield served
