"""Schemathesis over the published OpenAPI schema, against the API served by uvicorn on the real stack: whatever it
sends, valid or not, the answer is never a 5xx, is one the schema documents, and has the documented shape.

Admin routes are called with the admin token and the rest with a tenant's, so valid requests really create, read
and act on allocations; operations on one allocation or node also get a round with the id of a real one.

Then the schemathesis command itself runs every check (`--checks all`: also that the schema's valid requests are
accepted and its invalid ones refused, that a wrong method's 405 names the path's methods in `Allow`, that a route
refuses a request without its token) once with a tenant token and once with an admin token, as anyone would run it
against a deployed API; tests/api/schemathesis_hooks.py says which two built-in checks it refines and why."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from jsonschema import Draft202012Validator
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from temporalio.testing import WorkflowEnvironment

from tests.api import schemathesis_hooks  # noqa: F401 - its hooks shorten long polls and spare the run's token
from tests.api.served import Served, served_api
from tests.api.stack import Stack, api_fleet, bearer
from tests.workflows.deployment_lab import deployment
from workflows.deployment.spec import check_manifest

EXAMPLES = 5  # per operation and round: the CLI run below checks every operation with both tokens too
CLI_EXAMPLES = 3  # per operation and phase of a schemathesis command run, one per token kind
REPO = Path(__file__).resolve().parents[2]
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
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )  # the same cases every run
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
    with served_api(
        database_url, client.service_client.config.target_host, client.namespace, api_fleet(), tmp_path
    ) as served:
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
            if "{node}" in operation.path and not operation.path.endswith("/tokens"):  # not the lab's agents' tokens
                sent += _fuzz(served, operation, headers, path_parameters={"node": "big"})
        assert sent > 200


def _schemathesis(served: Served, token: str, home: Path) -> subprocess.Popen[str]:
    """`schemathesis run --checks all` with one token, short form: a fixed seed, a few examples per operation, the
    fuzzing and stateful phases. The coverage phase (boundary values of every field, wrong methods) is left to a
    run by hand: it sends some 3,300 requests per token, minutes here; its 405 finding is pinned below.
    BERTH_SCHEMATHESIS_SEED and BERTH_SCHEMATHESIS_EXAMPLES widen a run by hand."""
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{served.base_url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance,use_after_free",
        "-H",
        f"Authorization: Bearer {token}",
        "--seed",
        os.environ.get("BERTH_SCHEMATHESIS_SEED", "21"),
        "--max-examples",
        os.environ.get("BERTH_SCHEMATHESIS_EXAMPLES", str(CLI_EXAMPLES)),
        "--phases",
        "fuzzing,stateful",
        "--output-truncate",
        "false",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks", "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    home.mkdir()
    return subprocess.Popen(command, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_every_check_passes_with_a_tenant_token_and_with_an_admin_token(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = temporal_env.client
    with served_api(
        database_url, client.service_client.config.target_host, client.namespace, api_fleet(), tmp_path / "lab"
    ) as served:
        _wait_for_worker(served)
        runs = {
            kind: _schemathesis(served, token, tmp_path / kind)
            for kind, token in (("tenant", served.tenant_tokens["acme"]), ("admin", served.admin_token))
        }
        for kind, run in runs.items():
            output, _ = run.communicate(timeout=300)
            assert run.returncode == 0, f"with a {kind} token:\n{output[-20000:]}"
            selected = re.search(r"Selected: (\d+)/", output)
            assert selected is not None and f"Tested: {selected.group(1)}" in output  # every operation was called


async def test_a_wrong_method_is_told_every_method_of_its_path(stack: Stack) -> None:
    """Each method of a path is a route of its own; a 405 names them all in `Allow`, as the schema documents them."""
    for method, path, allowed in [
        ("OPTIONS", "/v1/allocations", "GET, POST"),
        ("PUT", "/v1/allocations/abc", "DELETE, GET"),
        ("PATCH", "/v1/deployments/web", "DELETE, GET, PUT"),
        ("DELETE", "/v1/audit", "GET, POST"),
    ]:
        response = await stack.http.request(method, path, headers=stack.acme)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["Allow"] == allowed
        assert response.json()["error"] == {
            "code": "method_not_allowed",
            "message": "Method Not Allowed",
            "details": None,
        }


async def test_fleet_files_schemathesis_broke_are_refused_not_server_errors(stack: Stack) -> None:
    """Found by schemathesis: a problem quoting `"\\udc80"` could not be encoded into the answer (500)."""
    body = '{"apiVersion": "berth.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "\\udc80"}}'
    response = await stack.http.put(
        "/v1/fleet", content=body, headers=stack.admin | {"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_fleet"
    assert "Tenant/?" in response.json()["error"]["message"]
    # Also found by it: a mapping as `kind`, a number as `metadata.name` (each was a 500 inside the fleet loader).
    for document in (
        "apiVersion: berth.dev/v1alpha1\nkind: {a: 1}\nmetadata: {name: web}\n",
        "apiVersion: berth.dev/v1alpha1\nkind: Tenant\nmetadata: {name: 5}\n",
    ):
        answer = await stack.http.put("/v1/fleet", content=document, headers=stack.admin)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_fleet", answer.text


def _allows(openapi: dict[str, Any], schema: dict[str, Any], value: Any) -> bool:
    """Whether a schema of the published document (its `$ref`s into the document's components) allows `value`."""
    return Draft202012Validator({**schema, "components": openapi["components"]}).is_valid(value)


def _body_schema(openapi: dict[str, Any], method: str, path: str, media: str = "application/json") -> dict[str, Any]:
    return openapi["paths"][path][method]["requestBody"]["content"][media]["schema"]


async def test_a_fleet_body_that_declares_nothing_is_refused_as_the_schema_says(stack: Stack) -> None:
    """Found by schemathesis (30 examples): a YAML body `null` was applied as "no changes" (200), though the schema
    asks for a document or a List of them. A body declaring nothing (empty, `null`, only comments, an empty List) is
    400 `invalid_fleet`, and the schema's List has at least one item."""
    openapi = (await stack.http.get("/openapi.json")).json()
    schema = _body_schema(openapi, "put", "/v1/fleet", "application/yaml")
    empty_list = {"kind": "List", "items": []}
    for text, value in (("null\n", None), ("", None), ("# nothing\n", None), (json.dumps(empty_list), empty_list)):
        assert not _allows(openapi, schema, value), text
        answer = await stack.http.put(
            "/v1/fleet", content=text, headers=stack.admin | {"Content-Type": "application/yaml"}
        )
        assert answer.status_code == 400, (text, answer.text)
        assert answer.json()["error"]["code"] == "invalid_fleet"
        assert "declares nothing" in answer.json()["error"]["message"]


async def test_a_members_pod_template_is_published_as_the_xrd_that_checks_it(stack: Stack) -> None:
    """Found by schemathesis (30 examples): the schema let a member's `template` be any object, while a PUT checks
    it against Modelplane's XRD (fleet/openapi.py) and refuses unknown fields (422). The schema is now the XRD's, as
    the check applies it: a template it allows is accepted, one the check refuses it does not allow."""
    openapi = (await stack.http.get("/openapi.json")).json()
    path = "/v1/namespaces/{namespace}/deployments/{name}"
    schema = _body_schema(openapi, "put", path)
    assert _body_schema(openapi, "put", path, "application/yaml") == schema
    manifest = deployment("llama", 1)
    member = manifest["spec"]["template"]["spec"]["engines"][0]["members"][0]
    member["template"] = {
        "metadata": {"labels": {"app": "llama"}},
        "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.8.5"}]},
    }
    assert _allows(openapi, schema, manifest)
    check_manifest(manifest, "llama", "lab")  # the PUT's own check accepts it
    member["template"]["sepc"] = {}  # misspelt
    assert not _allows(openapi, schema, manifest)
    answer = await stack.http.put("/v1/namespaces/lab/deployments/llama", json=manifest, headers=stack.admin)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert [(p["field"], p["type"]) for p in error["details"]] == [
        ("body.spec.template.spec.engines[0].members[0].template", "value_error")
    ]
    assert "sepc: is not a known field" in error["details"][0]["message"]


async def test_a_reported_host_holds_no_nul_as_the_schema_says(stack: Stack) -> None:
    """Found by schemathesis (30 examples): a NUL in a reported host's text is refused (422: PostgreSQL cannot store
    it, store/node_reports.py) while the published schema allowed it; the schema now states it for every string of
    the inventory, keys included."""
    openapi = (await stack.http.get("/openapi.json")).json()
    schema = _body_schema(openapi, "post", "/v1/nodes/{node}/report")
    report = {"agent": {"version": "x", "interval_seconds": 30}, "topology": "0", "host": {"hostname": "a"}}
    assert _allows(openapi, schema, report)
    for host in (
        {"hostname": "a\x00b"},
        {"problems": [{"path": "/sys\x00", "message": "unreadable"}]},
        {
            "pci_functions": {
                "0000:01:00.0\x00": {
                    "address": "0000:01:00.0",
                    "vendor_id": "10de",
                    "device_id": "2335",
                    "class_code": "030200",
                }
            }
        },
    ):
        assert not _allows(openapi, schema, {**report, "host": host}), host
        answer = await stack.http.post("/v1/nodes/small/report", json={**report, "host": host}, headers=stack.admin)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == "invalid_request"
        assert "NUL" in answer.json()["error"]["message"]
