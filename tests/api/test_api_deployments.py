"""`/v1/deployments` over HTTP against the real stack (PostgreSQL, Temporal, a control worker; simulated clusters):
what an operator sees when creating, reading, scaling and deleting a ModelDeployment, and every refusal."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from temporalio.client import Client

from api.app import create_app
from config.settings import Settings
from store.tokens import create_token, ensure_tenant_tokens
from tests.api.stack import FAST_CALLS, bearer, control_worker_seen, http_client
from tests.workflows.deployment_lab import FAST, DeploymentLab, deployment, deployment_lab, k8s_fleet

TENANT = {"apiVersion": "berth.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "acme"}, "spec": {"gpuQuota": 8}}


class Api:
    def __init__(self, http: httpx.AsyncClient, lab: DeploymentLab, admin: dict, acme: dict) -> None:
        self.http, self.lab, self.admin, self.acme = http, lab, admin, acme

    async def wait_for(self, name: str, check: Any, timeout: float = 30) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            response = await self.http.get(f"/v1/deployments/{name}", headers=self.admin)
            if response.status_code == 200 and check(body := response.json()):
                return body
            assert asyncio.get_running_loop().time() < deadline, response.text
            await asyncio.sleep(0.1)


@pytest.fixture
async def api(temporal_client: Client, sessions, tmp_path: Path) -> AsyncIterator[Api]:
    fleet = k8s_fleet({"east": 2, "west": 1}) + "---\n" + yaml.safe_dump(TENANT)
    async with deployment_lab(temporal_client, sessions, tmp_path, fleet) as lab:
        async with sessions.begin() as session:
            admin = await create_token(session, "admin", label="tests")
            tokens = await ensure_tenant_tokens(session)
        app = create_app(
            Settings(),
            sessions=sessions,
            temporal=temporal_client,
            queues=lab.queues,
            timeouts=FAST_CALLS,
            deployment_timing=FAST,
        )
        await control_worker_seen(app)
        async with http_client(app) as http:
            yield Api(http, lab, bearer(admin), bearer(tokens["acme"]))


def ready(n: int):
    return lambda d: d["available"] == n and len(d["replicas"]) == n and d["state"] == "steady"


async def test_put_get_scale_list_and_delete(api: Api) -> None:
    response = await api.http.put("/v1/deployments/llama", json=deployment("llama", 2), headers=api.admin)
    assert response.status_code == 202, response.text
    assert response.json() == {"name": "llama", "created": True, "workflow_id": "deployment/llama"}

    body = await api.wait_for("llama", ready(2))
    assert (body["desired"], body["phase"], body["live"]) == (2, "FullyScheduled", True)
    assert [(r["cluster"], r["index"], r["pools"], r["phase"]) for r in body["replicas"]] == [
        ("east", 0, {"serve": "serve"}, "ready"),
        ("west", 0, {"serve": "serve"}, "ready"),
    ]

    # YAML is accepted too; scaling past capacity is partial, with the explanation.
    manifest = yaml.safe_dump(deployment("llama", 4, min_replicas=1))
    response = await api.http.put(
        "/v1/deployments/llama", content=manifest, headers={**api.admin, "Content-Type": "application/yaml"}
    )
    assert response.status_code == 202 and response.json()["created"] is False
    body = await api.wait_for("llama", lambda d: d["desired"] == 4 and ready(3)(d))
    assert (body["phase"], body["reason"]) == ("PartiallyScheduled", "InsufficientCapacity")
    assert body["message"].startswith("3 of 4 replicas scheduled")

    listed = (await api.http.get("/v1/deployments", headers=api.admin)).json()["deployments"]
    assert [(d["name"], d["desired"], d["phase"]) for d in listed] == [("llama", 4, "PartiallyScheduled")]

    response = await api.http.delete("/v1/deployments/llama", headers=api.admin)
    assert response.status_code == 202
    deadline = asyncio.get_running_loop().time() + 30
    while (await api.http.get("/v1/deployments/llama", headers=api.admin)).status_code != 404:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)
    assert api.lab.workloads() == [] and await api.lab.ledger() == []
    assert (await api.http.get("/v1/deployments", headers=api.admin)).json() == {"deployments": [], "next_cursor": None}


async def test_refusals_use_the_error_envelope(api: Api) -> None:
    bad = deployment("llama", 2)
    bad["spec"]["replicas"] = -1
    response = await api.http.put("/v1/deployments/llama", json=bad, headers=api.admin)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"][0]["field"] == "body.spec.replicas"

    bad_cel = copy.deepcopy(deployment("llama", 1))
    member = bad_cel["spec"]["template"]["spec"]["engines"][0]["members"][0]
    member["nodeSelector"]["devices"][0]["selectors"][0]["cel"] = "device.attributes[ ==="
    error = (await api.http.put("/v1/deployments/llama", json=bad_cel, headers=api.admin)).json()["error"]
    assert error["details"][0]["field"].endswith("nodeSelector.devices[0].selectors[0].cel")
    assert "does not compile" in error["message"]

    error = (await api.http.put("/v1/deployments/other", json=deployment("llama", 1), headers=api.admin)).json()
    assert error["error"]["details"][0]["field"] == "body.metadata.name"

    response = await api.http.put("/v1/deployments/llama", content=b"{not json", headers=api.admin)
    assert response.status_code == 422 and response.json()["error"]["details"][0]["field"] == "body"

    for method, path in (("GET", "/v1/deployments/nope"), ("DELETE", "/v1/deployments/nope")):
        response = await api.http.request(method, path, headers=api.admin)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"

    # Deployments are admin-scoped: a tenant token is refused, no token is unauthenticated.
    response = await api.http.put("/v1/deployments/llama", json=deployment("llama", 1), headers=api.acme)
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert (await api.http.get("/v1/deployments", headers=api.acme)).status_code == 403
    assert (await api.http.get("/v1/deployments")).status_code == 401
    assert api.lab.workloads() == []


async def test_put_without_a_worker_is_503_and_starts_nothing(temporal_client: Client, sessions, tmp_path) -> None:
    (tmp_path / "fleet.yaml").write_text(k8s_fleet({"east": 1}))
    async with sessions.begin() as session:
        admin = await create_token(session, "admin", label="tests")
    from contracts.task_queues import Queues

    app = create_app(
        Settings(),
        sessions=sessions,
        temporal=temporal_client,
        queues=Queues(control="nobody-polls"),
        timeouts=FAST_CALLS,
    )
    async with http_client(app) as http:
        response = await http.put("/v1/deployments/orphan", json=deployment("orphan", 1), headers=bearer(admin))
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_control_worker"
    assert response.headers["Retry-After"] == "5"


async def test_a_fleet_change_replans_running_deployments(api: Api) -> None:
    response = await api.http.put("/v1/deployments/grow", json=deployment("grow", 4, min_replicas=1), headers=api.admin)
    assert response.status_code == 202
    await api.wait_for("grow", lambda d: ready(3)(d) and d["phase"] == "PartiallyScheduled")
    bigger = k8s_fleet({"east": 3, "west": 1}) + "---\n" + yaml.safe_dump(TENANT)
    applied = await api.http.put("/v1/fleet", content=bigger, headers={**api.admin, "Content-Type": "application/yaml"})
    assert applied.status_code == 200, applied.text
    assert applied.json()["deployments_told"] == 1  # `grow`, told at once
    body = await api.wait_for("grow", lambda d: ready(4)(d))  # no resync timer needed: the apply signalled it
    assert body["phase"] == "FullyScheduled"
    assert [(r["cluster"], r["index"]) for r in body["replicas"]] == [
        ("east", 0),
        ("east", 1),
        ("east", 2),
        ("west", 0),
    ]


async def test_a_get_can_wait_for_the_deployment_state(api: Api) -> None:
    """api/long_poll.py on deployments: the GET answers once the deployment is steady (or at its timeout); a state
    deployments do not have is a 422, and a deployment that does not exist is the usual 404, at once."""
    response = await api.http.put("/v1/deployments/waited", json=deployment("waited", 1), headers=api.admin)
    assert response.status_code == 202, response.text
    deadline = asyncio.get_running_loop().time() + 60
    while True:  # each long poll lasts at most its timeout; a loaded machine may need more than one
        body = await api.http.get("/v1/deployments/waited?wait_for=steady&timeout=30s", headers=api.admin)
        assert body.status_code == 200, body.text
        if body.json()["state"] == "steady" or asyncio.get_running_loop().time() > deadline:
            break
    assert body.json()["state"] == "steady"
    namespaced = await api.http.get(
        "/v1/namespaces/default/deployments/waited", params={"wait_for": "steady,deleted"}, headers=api.admin
    )
    assert namespaced.status_code == 200 and namespaced.json()["state"] == "steady"
    bad = await api.http.get("/v1/deployments/waited", params={"wait_for": "active"}, headers=api.admin)
    assert bad.status_code == 422 and "the states are pending, reconciling, steady" in bad.json()["error"]["message"]
    missing = await api.http.get("/v1/deployments/nosuch", params={"wait_for": "steady"}, headers=api.admin)
    assert missing.status_code == 404
