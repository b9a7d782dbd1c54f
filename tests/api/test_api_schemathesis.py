"""Schemathesis over the published OpenAPI schema, against the API served by uvicorn on the real stack: whatever it
sends, valid or not, the answer is never a 5xx, is one the schema documents, and has the documented shape.

Admin routes are called with the admin token and the rest with a tenant's, so valid requests really create, read
and act on allocations; operations on one allocation or node also get a round with the id of a real one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from temporalio.testing import WorkflowEnvironment

from tests.api.served import Served, served_api
from tests.api.stack import api_fleet, bearer

EXAMPLES = 20  # per operation and round: bounded so the whole run stays well under a minute
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _wait_for_worker(served: Served) -> None:
    deadline = time.monotonic() + 10
    while httpx.get(f"{served.base_url}/healthz").json()["control_workers"] == 0:
        assert time.monotonic() < deadline, "the control worker never polled"
        time.sleep(0.1)


def _fuzz(served: Served, operation: Any, headers: dict[str, str], **fixed: Any) -> int:
    """Run one round over one operation; return how many requests it sent."""
    sent = 0
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @given(case=operation.as_strategy(generation_mode=mode, **fixed))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def exchange(case: schemathesis.Case) -> None:
            nonlocal sent
            sent += 1
            case.validate_response(case.call(base_url=served.base_url, headers=headers), checks=CHECKS)

        try:
            exchange()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # nothing invalid to send to an operation without inputs
    return sent


def test_no_request_gets_a_server_error(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> None:
    client = temporal_env.client
    with served_api(database_url, client.service_client.config.target_host, client.namespace, api_fleet(),
                    tmp_path) as served:  # fmt: skip
        _wait_for_worker(served)
        admin, tenant = bearer(served.admin_token), bearer(served.tenant_tokens["acme"])
        real = httpx.post(f"{served.base_url}/v1/allocations", json={"gpu_count": 2}, headers=tenant)
        assert real.status_code == 202
        schema = schemathesis.openapi.from_url(f"{served.base_url}/openapi.json")
        sent = 0
        for result in schema.get_all_operations():
            operation = result.ok()
            headers = admin if "admin" in operation.tags else tenant
            sent += _fuzz(served, operation, headers)
            if "{allocation_id}" in operation.path:
                sent += _fuzz(served, operation, headers, path_parameters={"allocation_id": real.json()["id"]})
            if "{node}" in operation.path:
                sent += _fuzz(served, operation, headers, path_parameters={"node": "big"})
        assert sent > 400
