"""The shape of the contract itself: the error envelope for every kind of bad request, health, metrics, OpenAPI."""

from __future__ import annotations

from tests.api.stack import Stack


async def test_validation_errors_name_the_field(stack: Stack) -> None:
    cases = [
        ({"gpu_count": 0}, "body.gpu_count"),
        ({"gpu_count": 1, "shape": "vm"}, "body.shape"),
        ({"gpu_count": 1, "gpu_prodcut": "H200"}, "body.gpu_prodcut"),
        ({"gpu_count": 1, "labels": {"team": "a\x00b"}}, "body.labels.team"),
        ({"gpu_count": 1, "ssh_public_keys": ["not a key"]}, "body.ssh_public_keys[0]"),
        ({}, "body.gpu_count"),
    ]
    for body, field in cases:
        response = await stack.http.post("/v1/allocations", json=body, headers=stack.acme)
        assert response.status_code == 422, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_request"
        assert [problem["field"] for problem in error["details"]] == [field], (body, error)
        assert field in error["message"]
    not_json = await stack.http.post(
        "/v1/allocations", content=b"{", headers=stack.acme | {"Content-Type": "application/json"}
    )
    assert not_json.status_code == 422 and not_json.json()["error"]["code"] == "invalid_request"
    bad_query = await stack.http.get("/v1/allocations", params={"state": "sleeping"}, headers=stack.acme)
    assert bad_query.json()["error"]["details"][0]["field"] == "query.state"
    bad_id = await stack.http.get("/v1/allocations/..%2Fetc", headers=stack.acme)
    assert bad_id.status_code in (404, 422) and "error" in bad_id.json()
    assert (await stack.http.get("/v1/allocations/no-such-id", headers=stack.acme)).status_code == 404


async def test_unknown_routes_and_methods_use_the_envelope(stack: Stack) -> None:
    missing = await stack.http.get("/v1/nothing-here", headers=stack.acme)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = await stack.http.patch("/v1/allocations", headers=stack.acme)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


async def test_health_and_metrics(stack: Stack) -> None:
    health = await stack.http.get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "database": "ok", "temporal": "ok", "control_workers": 1}
    allocation_id = await stack.create(2)
    await stack.wait_for(allocation_id, "active")
    metrics = await stack.http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'berth_allocations{state="active"} 1.0' in text
    assert 'berth_allocations{state="failed"} 0.0' in text
    assert 'berth_api_requests_total{method="POST",route="/v1/allocations",status="202"} 1.0' in text
    assert 'route="/v1/allocations/{allocation_id}",status="200"' in text
    assert 'berth_api_requests_total{method="GET",route="/healthz",status="200"} 1.0' in text


async def test_openapi_documents_every_route(stack: Stack) -> None:
    schema = (await stack.http.get("/openapi.json")).json()
    routes = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}
    assert routes == {
        ("POST", "/v1/allocations"),
        ("GET", "/v1/allocations"),
        ("GET", "/v1/allocations/{allocation_id}"),
        ("DELETE", "/v1/allocations/{allocation_id}"),
        ("POST", "/v1/allocations/{allocation_id}/cancel"),
        ("POST", "/v1/allocations/{allocation_id}/retry"),
        ("POST", "/v1/allocations/{allocation_id}/extend"),
        ("POST", "/v1/reservations"),
        ("GET", "/v1/reservations"),
        ("POST", "/v1/tokens"),
        ("GET", "/v1/tokens"),
        ("DELETE", "/v1/tokens/{token_id}"),
        ("DELETE", "/v1/nodes/{node}/tokens"),
        ("GET", "/v1/capacity/at"),
        ("GET", "/v1/reservations/{reservation_id}"),
        ("DELETE", "/v1/reservations/{reservation_id}"),
        ("POST", "/v1/explain"),
        ("GET", "/v1/capacity"),
        ("PUT", "/v1/fleet"),
        ("GET", "/v1/queues"),
        ("GET", "/v1/usage"),
        ("GET", "/v1/nodes"),
        ("GET", "/v1/nodes/{node}"),
        ("POST", "/v1/nodes/{node}/cordon"),
        ("POST", "/v1/nodes/{node}/report"),
        ("POST", "/v1/nodes/{node}/uncordon"),
        ("POST", "/v1/nodes/{node}/repair"),
        ("POST", "/v1/nodes/{node}/drain"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("PUT", "/v1/deployments/{name}"),
        ("GET", "/v1/deployments/{name}"),
        ("DELETE", "/v1/deployments/{name}"),
        ("GET", "/v1/deployments"),
        ("GET", "/v1/audit"),
        ("POST", "/v1/audit"),
        ("PUT", "/v1/namespaces/{namespace}/deployments/{name}"),
        ("GET", "/v1/namespaces/{namespace}/deployments/{name}"),
        ("DELETE", "/v1/namespaces/{namespace}/deployments/{name}"),
        ("GET", "/v1/whoami"),
        ("GET", "/v1/auth"),
        ("GET", "/v1/audit/requests"),
    }
    assert schema["paths"]["/v1/allocations"]["post"]["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorEnvelope"
    }
    assert (await stack.http.get("/docs")).status_code == 200
