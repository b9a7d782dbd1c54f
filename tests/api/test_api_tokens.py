"""`/v1/tokens` against the real stack: what `berth tokens` does, through the API an admin calls. A token created is
shown once and works at once; the list never shows a plaintext; a revoked token is refused within seconds; a node's
rotation revokes all but the new token; every refusal is a 4xx naming what is wrong; and each of these requests is
in the request log under the admin who made it."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.api.stack import Stack, bearer


async def _create(stack: Stack, **body: Any) -> dict[str, Any]:
    response = await stack.http.post("/v1/tokens", json=body, headers=stack.admin)
    assert response.status_code == 201, response.text
    return response.json()


async def _listed(stack: Stack, everything: bool = False) -> dict[int, dict[str, Any]]:
    response = await stack.http.get("/v1/tokens", params={"all": str(everything).lower()}, headers=stack.admin)
    assert response.status_code == 200, response.text
    return {token["id"]: token for token in response.json()["tokens"]}


async def _refused_within_seconds(stack: Stack, token: str) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + 30  # the token cache sweeps revocations every few seconds
    while True:
        answer = await stack.http.get("/v1/whoami", headers=bearer(token))
        if answer.status_code == 401:
            return answer.json()["error"]
        assert asyncio.get_running_loop().time() < deadline, f"a revoked token still works: {answer.text}"
        await asyncio.sleep(0.2)


async def test_a_token_is_created_listed_used_and_revoked(stack: Stack) -> None:
    created = await _create(stack, tenant="acme", role="viewer", label="dashboard", expires_in="90d")
    assert (created["role"], created["tenant"], created["node"], created["label"]) == (
        "viewer",
        "acme",
        None,
        "dashboard",
    )
    assert created["token"].startswith("berth_") and created["expires_at"] is not None
    me = (await stack.http.get("/v1/whoami", headers=bearer(created["token"]))).json()
    assert (me["role"], me["tenants"]) == ("viewer", {"acme": "viewer"})

    listed = await _listed(stack)
    mine = listed[created["id"]]
    assert "token" not in mine and mine["revoked_at"] is None and mine["created_at"]
    assert (mine["role"], mine["tenant"], mine["label"]) == ("viewer", "acme", "dashboard")
    assert mine["expires_at"] is not None

    # An operator's token needs no tenant; a member is the default for a tenant; expires_in takes typed durations.
    operator = await _create(stack, role="operator", expires_in="12h")
    assert (operator["role"], operator["tenant"]) == ("operator", None)
    member = await _create(stack, tenant="globex")
    assert member["role"] == "member" and member["expires_at"] is None

    revoked = await stack.http.delete(f"/v1/tokens/{created['id']}", headers=stack.admin)
    assert revoked.status_code == 200 and revoked.json() == {"revoked": [created["id"]]}
    again = await stack.http.delete(f"/v1/tokens/{created['id']}", headers=stack.admin)
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
    assert f"no live token with id {created['id']}" in again.json()["error"]["message"]
    assert (await _refused_within_seconds(stack, created["token"]))["code"] == "token_revoked"

    assert created["id"] not in await _listed(stack)
    assert (await _listed(stack, everything=True))[created["id"]]["revoked_at"] is not None


async def test_a_node_rotation_revokes_all_but_the_new_token(stack: Stack) -> None:
    old = await _create(stack, node="small", label="first")
    new = await _create(stack, node="small", role="node", label="rotated")
    assert (old["role"], old["node"], old["tenant"]) == ("node", "small", None)

    response = await stack.http.delete("/v1/nodes/small/tokens", params={"keep": new["id"]}, headers=stack.admin)
    assert response.status_code == 200, response.text
    revoked = response.json()["revoked"]
    assert old["id"] in revoked and new["id"] not in revoked
    live = await _listed(stack)
    assert new["id"] in live and old["id"] not in live
    assert (await _refused_within_seconds(stack, old["token"]))["code"] == "token_revoked"

    # Nothing left to revoke but the kept one: an empty answer, not an error.
    response = await stack.http.delete("/v1/nodes/small/tokens", params={"keep": new["id"]}, headers=stack.admin)
    assert response.status_code == 200 and response.json() == {"revoked": []}


async def test_refusals_name_what_is_wrong(stack: Stack) -> None:
    async def refused(body: dict[str, Any]) -> dict[str, Any]:
        response = await stack.http.post("/v1/tokens", json=body, headers=stack.admin)
        assert response.status_code == 422, response.text
        return response.json()["error"]

    for body in ({}, {"role": "admin", "tenant": "acme"}, {"tenant": "acme", "node": "small"}, {"role": "viewer"}):
        error = await refused(body)
        assert error["code"] == "invalid_request"
        assert "give exactly one of tenant (viewer or member), role operator|admin, or node" in error["message"]
    assert "has the role node, not member" in (await refused({"node": "small", "role": "member"}))["message"]
    assert "has no unit" in (await refused({"role": "admin", "expires_in": "5"}))["message"]
    assert "more than 0" in (await refused({"role": "admin", "expires_in": "0"}))["message"]
    assert (await refused({"role": "root"}))["details"][0]["field"] == "body.role"

    unknown = await refused({"tenant": "initech"})
    assert unknown["code"] == "unknown_tenant" and unknown["details"][0]["field"] == "body.tenant"
    assert "unknown tenant 'initech'" in unknown["message"]
    unknown = await refused({"node": "nosuch"})
    assert unknown["code"] == "unknown_node" and "unknown node 'nosuch'" in unknown["message"]

    # Only an admin manages tokens: a tenant's member, or an operator, is refused.
    operator = await _create(stack, role="operator")
    for who in (stack.acme, bearer(operator["token"])):
        assert (await stack.http.get("/v1/tokens", headers=who)).status_code == 403
        assert (await stack.http.post("/v1/tokens", json={"role": "admin"}, headers=who)).status_code == 403


async def test_every_token_request_is_in_the_request_log_under_its_caller(stack: Stack) -> None:
    actor = (await stack.http.get("/v1/whoami", headers=stack.admin)).json()["actor"]
    created = await _create(stack, node="big")
    await stack.http.delete(f"/v1/tokens/{created['id']}", headers=stack.admin)
    await stack.http.delete("/v1/nodes/big/tokens", headers=stack.admin)
    await stack.http.post("/v1/tokens", json={"tenant": "initech"}, headers=stack.admin)  # refused: logged too
    wanted = {
        ("POST", "/v1/tokens", "/v1/tokens", 201),
        ("DELETE", "/v1/tokens/{token_id}", f"/v1/tokens/{created['id']}", 200),
        ("DELETE", "/v1/nodes/{node}/tokens", "/v1/nodes/big/tokens", 200),
        ("POST", "/v1/tokens", "/v1/tokens", 422),
    }
    deadline = asyncio.get_running_loop().time() + 30  # each is recorded just after its answer is sent
    while True:
        log = await stack.http.get("/v1/audit/requests", params={"actor": actor}, headers=stack.admin)
        assert log.status_code == 200, log.text
        seen = {(r["method"], r["route"], r["path"], r["status"]) for r in log.json()["requests"]}
        if wanted <= seen:
            break
        assert asyncio.get_running_loop().time() < deadline, f"missing from the request log: {wanted - seen}"
        await asyncio.sleep(0.2)
    assert all(r["actor"] == actor and r["role"] == "admin" for r in log.json()["requests"])
    assert created["token"] not in log.text  # the path and the status only, never a plaintext
