"""Who may do what: tokens, tenant isolation, admin-only routes, and Idempotency-Key."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from store.models import AllocationRow, ApiTokenRow
from store.tokens import create_token, ensure_tenant_tokens, verify
from tests.api.stack import Stack, bearer


async def test_requests_without_a_valid_token_are_401_in_the_envelope(stack: Stack) -> None:
    for headers in ({}, bearer("berth_not-a-real-token"), {"Authorization": "Basic dXNlcjpwYXNz"}):
        response = await stack.http.get("/v1/allocations", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] in ("unauthenticated", "invalid_token")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/nodes/small/drain"),
        ("POST", "/v1/nodes/small/cordon"),
        ("POST", "/v1/nodes/small/uncordon"),
        ("PUT", "/v1/fleet"),
    ],
)
async def test_admin_routes_refuse_tenant_tokens(stack: Stack, method: str, path: str) -> None:
    response = await stack.http.request(method, path, headers=stack.acme, content="{}")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


async def test_another_tenants_allocation_does_not_exist_for_a_tenant(stack: Stack) -> None:
    mine = await stack.create(2, who=stack.acme)
    await stack.wait_for(mine, "active")
    for method, path, body in [
        ("GET", f"/v1/allocations/{mine}", None),
        ("POST", f"/v1/allocations/{mine}/cancel", None),
        ("POST", f"/v1/allocations/{mine}/extend", {"by": "1h"}),
        ("DELETE", f"/v1/allocations/{mine}", None),
    ]:
        response = await stack.http.request(method, path, json=body, headers=stack.globex)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"] == {
            "code": "not_found",
            "message": f"allocation '{mine}' does not exist",
            "details": {"kind": "allocation", "name": mine},
        }
    assert (await stack.http.get("/v1/allocations", headers=stack.globex)).json() == {
        "allocations": [],
        "next_cursor": None,
    }
    assert (await stack.http.get("/v1/allocations", params={"tenant": "acme"}, headers=stack.globex)).json() == {
        "allocations": [],
        "next_cursor": None,
    }
    # Nothing happened to it, and its owner and the admin still see it.
    assert (await stack.get(mine, who=stack.acme))["state"] == "active"
    listed = await stack.http.get("/v1/allocations", params={"tenant": "acme"}, headers=stack.admin)
    assert [a["id"] for a in listed.json()["allocations"]] == [mine]


async def test_who_an_allocation_is_for(stack: Stack) -> None:
    other = await stack.http.post("/v1/allocations", json={"gpu_count": 1, "tenant": "acme"}, headers=stack.globex)
    assert other.status_code == 403 and other.json()["error"]["code"] == "forbidden"

    unnamed = await stack.http.post("/v1/allocations", json={"gpu_count": 1}, headers=stack.admin)
    assert unnamed.status_code == 422
    assert unnamed.json()["error"]["details"][0]["field"] == "body.tenant"

    unknown = await stack.http.post("/v1/allocations", json={"gpu_count": 1, "tenant": "initech"}, headers=stack.admin)
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "unknown_tenant"

    for_globex = await stack.http.post(
        "/v1/allocations", json={"gpu_count": 2, "tenant": "globex"}, headers=stack.admin
    )
    assert for_globex.status_code == 202
    assert (await stack.get(for_globex.json()["id"], who=stack.globex))["tenant"] == "globex"
    async with stack.lab.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AllocationRow)) == 1


async def test_idempotency_key_same_body_same_allocation_other_body_409(stack: Stack) -> None:
    key = {"Idempotency-Key": "order-7"}
    first = await stack.http.post("/v1/allocations", json={"gpu_count": 2}, headers=stack.acme | key)
    assert first.status_code == 202
    # The same request again, spelt differently (defaults written out): the same allocation, 200.
    again = await stack.http.post(
        "/v1/allocations", json={"shape": "gpu_slice", "gpu_count": 2, "tenant": "acme"}, headers=stack.acme | key
    )
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]

    changed = await stack.http.post("/v1/allocations", json={"gpu_count": 4}, headers=stack.acme | key)
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_conflict"
    assert changed.json()["error"]["details"] == {"allocation_id": first.json()["id"]}

    # Keys belong to a tenant: globex's "order-7" is another allocation.
    theirs = await stack.http.post("/v1/allocations", json={"gpu_count": 2}, headers=stack.globex | key)
    assert theirs.status_code == 202 and theirs.json()["id"] != first.json()["id"]
    async with stack.lab.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AllocationRow)) == 2


async def test_concurrent_requests_with_one_key_create_one_allocation(stack: Stack) -> None:
    key = {"Idempotency-Key": "burst"}
    answers = await asyncio.gather(
        *(stack.http.post("/v1/allocations", json={"gpu_count": 1}, headers=stack.acme | key) for _ in range(5))
    )
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 200, 202]
    assert len({a.json()["id"] for a in answers}) == 1


async def test_tokens_are_stored_hashed_and_issued_once_per_tenant(stack: Stack) -> None:
    async with stack.lab.sessions.begin() as session:
        token = await create_token(session, "member", "acme", label="ci")
        assert await ensure_tenant_tokens(session) == {}  # both tenants already hold one
        stored = (await session.scalars(select(ApiTokenRow.token_sha256))).all()
        assert token not in stored and all(len(digest) == 64 for digest in stored)
        principal = await verify(session, token)
        assert principal is not None and (principal.role, principal.tenants) == ("member", {"acme": "member"})
        assert await verify(session, token + "x") is None
        with pytest.raises(ValueError, match="unknown tenant"):
            await create_token(session, "member", "initech")
        with pytest.raises(ValueError, match="operator or admin token no tenant"):
            await create_token(session, "admin", "acme")
