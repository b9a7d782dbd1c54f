"""People call the API with their own identity: ID tokens from a real OIDC provider process (tests/oidc_provider.py,
through its discovery document, JWKS and token endpoint), mapped by their groups to roles in tenants; and every
token that is not a good one of that issuer is refused with a 401 and a code a client can act on.

The lab fleet (tests/api/stack.py) has tenants acme and globex. Groups: `acme-ml` are members of acme,
`acme-watchers` viewers of acme, `sre` operators.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey
from sqlalchemy import select
from temporalio.client import Client

from api.oidc import OidcVerifier
from config.identity import OidcSettings
from store.models import ApiRequestRow
from store.tokens import create_token, ensure_tenant_tokens, revoke_tokens
from tests.api.stack import api_fleet, app_for, bearer, control_worker_seen, http_client
from tests.identity.provider import CLIENT_ID, Provider, running_provider
from tests.workflows.lab import running_lab
from workflows.search_attributes import ACTOR

ROLES = {"acme-ml": ["member:acme"], "acme-watchers": ["viewer:acme"], "sre": ["operator"]}


@dataclass
class People:
    app: FastAPI
    http: httpx.AsyncClient
    provider: Provider
    admin: dict[str, str]
    acme: dict[str, str]  # acme's service account (a member token)
    node: dict[str, str]  # node `small`'s agent token

    def person(self, sub: str, *groups: str) -> dict[str, str]:
        """`sub` logs in (the authorization-code flow with PKCE) and sends the ID token."""
        tokens = self.provider.login(sub, email=sub, groups=list(groups))
        return bearer(tokens["id_token"])


@pytest.fixture
async def people(temporal_client: Client, sessions, oidc_provider: Provider, tmp_path: Path) -> AsyncIterator[People]:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, api_fleet()) as lab:
        async with sessions.begin() as session:
            admin = await create_token(session, "admin", label="tests")
            acme = (await ensure_tenant_tokens(session))["acme"]
            node = await create_token(session, "node", node="small", label="tests")
        app = app_for(
            sessions,
            temporal_client,
            lab.queues,
            oidc_issuer_url=oidc_provider.issuer,
            oidc_client_id=CLIENT_ID,
            oidc_roles=ROLES,
        )
        await control_worker_seen(app)
        async with http_client(app) as http:
            yield People(app, http, oidc_provider, bearer(admin), bearer(acme), bearer(node))


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_a_member_logs_in_creates_and_is_named_as_the_one_who_asked(people: People, temporal_client) -> None:
    alice = people.person("alice@example.com", "acme-ml", "unmapped-group")
    me = (await people.http.get("/v1/whoami", headers=alice)).json()
    assert (me["actor"], me["kind"], me["role"], me["tenants"]) == (
        "alice@example.com",
        "person",
        "member",
        {"acme": "member"},
    )
    assert me["groups"] == ["acme-ml", "unmapped-group"]
    assert me["expires_at"] is not None  # the ID token's own end

    created = await people.http.post("/v1/allocations", json={"gpu_count": 1}, headers=alice)
    assert created.status_code == 202, created.text
    allocation = created.json()["id"]
    shown = (await people.http.get(f"/v1/allocations/{allocation}", headers=alice)).json()
    assert shown["requested_by"] == "alice@example.com" and shown["tenant"] == "acme"
    # The Temporal UI lists it by who asked.
    described = await temporal_client.get_workflow_handle(created.json()["workflow_id"]).describe()
    assert described.typed_search_attributes.get(ACTOR) == "alice@example.com"

    cancelled = await people.http.post(f"/v1/allocations/{allocation}/cancel", headers=alice)
    assert cancelled.status_code == 202, cancelled.text
    events = (await people.http.get(f"/v1/allocations/{allocation}", headers=people.admin)).json()["events"]
    assert [(e["step"], e["actor"]) for e in events if e["actor"]] == [("cancel_requested", "alice@example.com")]


async def test_roles_decide_what_each_person_may_do(people: People) -> None:
    created = await people.http.post("/v1/allocations", json={"gpu_count": 1}, headers=people.acme)
    allocation = created.json()["id"]

    viewer = people.person("victor@example.com", "acme-watchers")
    assert (await people.http.get(f"/v1/allocations/{allocation}", headers=viewer)).status_code == 200
    refused = await people.http.post("/v1/allocations", json={"gpu_count": 1}, headers=viewer)
    assert _error(refused) == (403, "forbidden"), refused.text
    assert "needs the member role" in refused.json()["error"]["message"]

    # A person in no mapped group belongs to no tenant: acme's allocation does not exist for them.
    stranger = people.person("sam@example.com", "marketing")
    assert _error(await people.http.get(f"/v1/allocations/{allocation}", headers=stranger)) == (404, "not_found")
    listed = await people.http.get("/v1/allocations", headers=stranger)
    assert listed.status_code == 200 and listed.json()["allocations"] == []
    nodes = await people.http.get("/v1/nodes", headers=stranger)  # the nodes of no region it may use: none
    assert nodes.status_code == 200 and nodes.json()["nodes"] == [], nodes.text
    assert _error(await people.http.post("/v1/nodes/small/cordon", headers=stranger)) == (403, "forbidden")

    operator = people.person("olga@example.com", "sre")
    assert (await people.http.get("/v1/nodes", headers=operator)).status_code == 200
    assert (await people.http.post("/v1/nodes/small/cordon", headers=operator)).status_code == 200
    applied = await people.http.put("/v1/fleet", content="{}", headers=operator | {"Content-Type": "application/json"})
    assert _error(applied) == (403, "forbidden"), applied.text

    # Every mutating request is on record with who made it, refusals too.
    async with people.app.state.services.sessions() as session:
        rows = (
            await session.execute(
                select(ApiRequestRow.actor, ApiRequestRow.route, ApiRequestRow.status).order_by(ApiRequestRow.id)
            )
        ).all()
    assert ("olga@example.com", "/v1/nodes/{node}/cordon", 200) in rows
    assert ("olga@example.com", "/v1/fleet", 403) in rows
    assert ("victor@example.com", "/v1/allocations", 403) in rows


async def test_a_refreshed_token_works_and_a_rotated_key_needs_no_restart(people: People) -> None:
    people.app.state.services.oidc = OidcVerifier(
        OidcSettings(issuer=people.provider.issuer, client_id=CLIENT_ID, roles=ROLES, jwks_refresh_seconds=0)
    )
    tokens = people.provider.login("rita@example.com", email="rita@example.com", groups=["acme-ml"])
    assert (await people.http.get("/v1/whoami", headers=bearer(tokens["id_token"]))).status_code == 200

    refreshed = people.provider.refresh(tokens["refresh_token"])
    assert refreshed["id_token"] != tokens["id_token"]
    me = await people.http.get("/v1/whoami", headers=bearer(refreshed["id_token"]))
    assert me.status_code == 200 and me.json()["actor"] == "rita@example.com"

    # The provider rotates its key: tokens signed with the new one (with its kid, and without one, as this
    # provider's own ID tokens are) are taken by the same API process, which fetches the keys again.
    new_kid = people.provider.rotate()
    signed = people.provider.sign(sub="rita@example.com", email="rita@example.com", groups=["acme-ml"])
    assert json.loads(base64.urlsafe_b64decode(signed.split(".")[0] + "=="))["kid"] == new_kid
    assert (await people.http.get("/v1/whoami", headers=bearer(signed))).status_code == 200
    again = people.provider.login("rita@example.com", email="rita@example.com", groups=["acme-ml"])
    assert (await people.http.get("/v1/whoami", headers=bearer(again["id_token"]))).status_code == 200
    # The old key is gone from the set: a token it signed no longer verifies.
    assert _error(await people.http.get("/v1/whoami", headers=bearer(refreshed["id_token"]))) == (401, "unknown_key")


def _unsigned(header: dict[str, object], claims: dict[str, object], secret: bytes | None = None) -> str:
    """A token built by hand: `alg: none` (no signature), or HMAC-signed with `secret`."""

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    head = f"{part(header)}.{part(claims)}"
    if secret is None:
        return head + "."
    mac = hmac.new(secret, head.encode(), hashlib.sha256).digest()
    return head + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


async def test_every_bad_token_is_a_401_with_its_reason(people: People, other_provider: Provider) -> None:
    provider = people.provider
    now = int(time.time())
    good = {"iss": provider.issuer, "aud": CLIENT_ID, "sub": "mallory", "iat": now, "exp": now + 600}
    public_key = RSAKey.import_key(httpx.get(provider.discovery()["jwks_uri"]).json()["keys"][0])
    cases = {
        "token_expired": provider.sign(exp=now - 3600, iat=now - 7200),
        "token_not_yet_valid": provider.sign(nbf=now + 3600),
        "wrong_issuer": provider.sign(iss="https://login.example.com"),
        "wrong_audience": provider.sign(aud="some-other-app"),
        "unsupported_algorithm": _unsigned({"alg": "none"}, good),
        # HS256 "signed" with the provider's public key, which anyone can fetch: never an HMAC secret.
        "unsupported_algorithm ": _unsigned({"alg": "HS256"}, good, public_key.as_pem(private=False)),
        # A good token of another issuer, and one of its tokens claiming to be ours.
        "wrong_issuer ": other_provider.login("mallory", email="mallory@example.com", groups=["acme-ml"])["id_token"],
        "unknown_key": other_provider.sign(iss=provider.issuer),
        "invalid_token": "not.a-jwt.at-all",
        "invalid_token ": "berth_" + "x" * 43,  # a Berth token nobody issued
    }
    for code, token in cases.items():
        answer = await people.http.get("/v1/whoami", headers=bearer(token))
        assert _error(answer) == (401, code.strip()), (code, answer.text)
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert _error(await people.http.get("/v1/whoami")) == (401, "unauthenticated")


async def test_node_tokens_and_user_tokens_stay_on_their_own_routes(people: People) -> None:
    alice = people.person("alice@example.com", "acme-ml")
    report = {"node": "small", "slots": []}
    for who in (alice, people.acme):
        answer = await people.http.post("/v1/nodes/small/report", json=report, headers=who)
        assert _error(answer) == (403, "not_a_node"), answer.text
    answer = await people.http.get("/v1/allocations", headers=people.node)
    assert _error(answer) == (403, "node_token"), answer.text


async def test_an_unreachable_provider_is_a_503_that_names_it(people: People) -> None:
    """The token may well be good: the API cannot tell, and says why, instead of refusing the person."""
    token = people.provider.sign(sub="alice@example.com")
    people.app.state.services.oidc = OidcVerifier(
        OidcSettings(issuer=people.provider.issuer.rsplit(":", 1)[0] + ":9", client_id=CLIENT_ID)
    )
    answer = await people.http.get("/v1/whoami", headers=bearer(token))
    assert _error(answer) == (401, "wrong_issuer")  # told before anything is fetched: it is not this API's issuer
    unreachable = people.provider.issuer.rsplit(":", 1)[0] + ":9"
    people.app.state.services.oidc = OidcVerifier(OidcSettings(issuer=unreachable, client_id=CLIENT_ID))
    forged = people.provider.sign(iss=unreachable)
    answer = await people.http.get("/v1/whoami", headers=bearer(forged))
    assert _error(answer) == (503, "identity_provider_unavailable"), answer.text
    assert unreachable in answer.json()["error"]["message"]
    # When to try again: the verifier asks the provider again no sooner than `jwks_refresh_seconds` (10 s).
    assert answer.headers["Retry-After"] == "10"
    again = await people.http.get("/v1/whoami", headers=bearer(forged))
    assert _error(again) == (503, "identity_provider_unavailable"), again.text
    assert again.json()["error"]["message"] == answer.json()["error"]["message"]
    assert 1 <= int(again.headers["Retry-After"]) <= 10
    people.app.state.services.oidc = OidcVerifier(
        OidcSettings(issuer=unreachable, client_id=CLIENT_ID, jwks_refresh_seconds=30)
    )
    answer = await people.http.get("/v1/whoami", headers=bearer(forged))
    assert _error(answer) == (503, "identity_provider_unavailable") and answer.headers["Retry-After"] == "30"
    assert (await people.http.get("/v1/whoami", headers=people.acme)).status_code == 200  # Berth tokens still work


async def test_a_service_accounts_token_holds_its_role_until_it_expires_or_is_revoked(people: People) -> None:
    """`berth tokens create --tenant acme --role viewer --expires-in ...`, and `revoke --id`, as the API sees them."""
    sessions = people.app.state.services.sessions
    async with sessions.begin() as session:
        viewer = await create_token(
            session, "viewer", "acme", label="dashboard", expires_at=datetime.now(UTC) + timedelta(days=30)
        )
        expired = await create_token(
            session, "member", "acme", label="old ci", expires_at=datetime.now(UTC) - timedelta(seconds=1)
        )
    me = (await people.http.get("/v1/whoami", headers=bearer(viewer))).json()
    assert (me["role"], me["tenants"], me["actor"]) == (
        "viewer",
        {"acme": "viewer"},
        f"token:{me['token_id']} (dashboard)",
    )
    refused = await people.http.post("/v1/allocations", json={"gpu_count": 1}, headers=bearer(viewer))
    assert _error(refused) == (403, "forbidden")
    assert _error(await people.http.get("/v1/whoami", headers=bearer(expired))) == (401, "token_expired")

    async with sessions.begin() as session:
        assert await revoke_tokens(session, token_id=me["token_id"]) == [me["token_id"]]
    assert _error(await people.http.get("/v1/whoami", headers=bearer(viewer))) == (401, "token_revoked")


async def test_an_unverified_email_never_names_the_caller(people: People) -> None:
    """With the username claim `email` (the default), a token whose `email_verified` is false is refused, as
    Kubernetes' OIDC authenticator refuses it: anyone may sign up at some providers with an address they do not own.
    A token that does not say (no `email_verified`) is taken, as Kubernetes takes it."""
    unverified = people.provider.login("eve", email="alice@example.com", email_verified=False, groups=["acme-ml"])
    answer = await people.http.get("/v1/whoami", headers=bearer(unverified["id_token"]))
    assert _error(answer) == (401, "email_not_verified"), answer.text
    assert "alice@example.com" in answer.json()["error"]["message"]
    assert answer.headers["WWW-Authenticate"] == "Bearer"

    verified = people.provider.login("alice", email="alice@example.com", email_verified=True, groups=["acme-ml"])
    me = await people.http.get("/v1/whoami", headers=bearer(verified["id_token"]))
    assert me.status_code == 200 and me.json()["actor"] == "alice@example.com", me.text
    unsaid = people.provider.sign(sub="bob", email="bob@example.com")
    me = await people.http.get("/v1/whoami", headers=bearer(unsaid))
    assert me.status_code == 200 and me.json()["actor"] == "bob@example.com", me.text


async def test_a_malformed_token_is_a_401_never_a_500(people: People) -> None:
    """Whatever a bearer holds, reading it ends in a 401 `invalid_token`: a payload nested too deep to parse, a
    provider-signed `exp` past any date, bytes that are not base64 or not UTF-8."""
    kid = httpx.get(people.provider.discovery()["jwks_uri"]).json()["keys"][0]["kid"]
    header = {"alg": "RS256", "kid": kid}

    def raw(head: bytes, payload: bytes) -> str:
        return ".".join(base64.urlsafe_b64encode(part).rstrip(b"=").decode() for part in (head, payload, b"sig"))

    cases = {
        "a payload nested 5,000 deep": raw(json.dumps(header).encode(), b"[" * 5000 + b"]" * 5000),
        "a claim nested 5,000 deep": raw(
            json.dumps(header).encode(),
            b'{"iss": "' + people.provider.issuer.encode() + b'", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        ),
        "an exp of 10**20": people.provider.sign(sub="mallory", exp=10**20),
        "a payload that is not UTF-8": raw(json.dumps(header).encode(), b'{"iss": "\xff"}'),
        "a payload that is not base64": raw(json.dumps(header).encode(), b"{}").replace(".e30.", ".!!!.", 1),
        "a header that is a list": raw(b"[1, 2]", b"{}"),
    }
    for case, token in cases.items():
        answer = await people.http.get("/v1/whoami", headers=bearer(token))
        assert _error(answer) == (401, "invalid_token"), (case, answer.text)
        assert answer.json()["error"]["message"].startswith("the token cannot be read: "), (case, answer.text)
        assert answer.headers["WWW-Authenticate"] == "Bearer"


async def test_a_token_without_kid_is_checked_with_each_key_of_its_algorithms_type(people: People) -> None:
    """A provider that signs with an RSA and an EC key publishes both; an ES256 token that names no key is checked
    with the EC key, not refused at the RSA key that comes first."""
    ec_key = ECKey.generate_key("P-256")
    with running_provider() as provider:
        provider.publish(ec_key.as_dict(private=False) | {"alg": "ES256", "use": "sig"})
        jwks = httpx.get(provider.discovery()["jwks_uri"]).json()["keys"]
        assert [key["kty"] for key in jwks] == ["RSA", "EC"]
        people.app.state.services.oidc = OidcVerifier(OidcSettings(issuer=provider.issuer, client_id=CLIENT_ID))
        now = int(time.time())
        claims = {"iss": provider.issuer, "aud": CLIENT_ID, "sub": "erin", "email": "erin@example.com"}
        token = jwt.encode({"alg": "ES256"}, claims | {"iat": now, "exp": now + 600}, ec_key)
        me = await people.http.get("/v1/whoami", headers=bearer(token))
        assert me.status_code == 200 and me.json()["actor"] == "erin@example.com", me.text

        # Signed by some other EC key, it is still refused: every key of the type was tried.
        forged = jwt.encode({"alg": "ES256"}, claims | {"iat": now, "exp": now + 600}, ECKey.generate_key("P-256"))
        assert _error(await people.http.get("/v1/whoami", headers=bearer(forged))) == (401, "invalid_signature")


async def test_a_key_the_provider_removed_is_refused_once_the_cached_keys_are_too_old(people: People) -> None:
    """The keys are cached for `jwks_max_age_seconds` at most: a key the provider has withdrawn (say, after it
    leaked) stops verifying tokens by then, even if no token with an unknown key id ever makes the API look."""
    settings = OidcSettings(issuer=people.provider.issuer, client_id=CLIENT_ID, roles=ROLES, jwks_max_age_seconds=1)
    people.app.state.services.oidc = OidcVerifier(settings)
    leaked = people.provider.sign(sub="rita@example.com", email="rita@example.com", groups=["acme-ml"])
    assert (await people.http.get("/v1/whoami", headers=bearer(leaked))).status_code == 200

    people.provider.rotate()  # the old key is gone from the provider's JWKS
    await asyncio.sleep(2.5)  # well past the keys' maximum age
    answer = await people.http.get("/v1/whoami", headers=bearer(leaked))
    assert _error(answer) == (401, "unknown_key"), answer.text
    fresh = people.provider.sign(sub="rita@example.com", email="rita@example.com", groups=["acme-ml"])
    assert (await people.http.get("/v1/whoami", headers=bearer(fresh))).status_code == 200


async def test_keys_too_old_to_trust_and_no_provider_to_refresh_them_are_a_503(people: People) -> None:
    """Past their maximum age the cached keys are not used, even when the provider cannot be reached to replace
    them: a withdrawn key must stop working within the maximum age, whatever happens to the provider."""
    with running_provider() as provider:
        settings = OidcSettings(issuer=provider.issuer, client_id=CLIENT_ID, jwks_max_age_seconds=1)
        people.app.state.services.oidc = OidcVerifier(settings)
        token = provider.sign(sub="rita", email="rita@example.com")
        assert (await people.http.get("/v1/whoami", headers=bearer(token))).status_code == 200
    await asyncio.sleep(2.5)  # the provider is stopped, and the keys are well past their maximum age
    answer = await people.http.get("/v1/whoami", headers=bearer(token))
    assert _error(answer) == (503, "identity_provider_unavailable"), answer.text
    assert provider.issuer in answer.json()["error"]["message"] and answer.headers["Retry-After"] == "10"


async def test_every_refusal_at_authentication_is_counted_by_its_code(people: People) -> None:
    """Callers who never proved who they are have no place in the request log; `/metrics` counts them, by code, once
    each, whether the refusal came before the body was read (a create) or at the route (a read)."""
    junk = bearer("not.a-jwt.at-all")
    assert _error(await people.http.get("/v1/whoami", headers=junk)) == (401, "invalid_token")
    refused = await people.http.post("/v1/allocations", json={"gpu_count": 1}, headers=junk)
    assert _error(refused) == (401, "invalid_token")
    assert _error(await people.http.get("/v1/whoami")) == (401, "unauthenticated")
    unreachable = people.provider.issuer.rsplit(":", 1)[0] + ":9"
    people.app.state.services.oidc = OidcVerifier(OidcSettings(issuer=unreachable, client_id=CLIENT_ID))
    unverifiable = bearer(people.provider.sign(iss=unreachable))
    assert _error(await people.http.get("/v1/whoami", headers=unverifiable)) == (503, "identity_provider_unavailable")
    assert (await people.http.get("/v1/whoami", headers=people.acme)).status_code == 200  # no refusal, not counted

    scraped = await people.http.get("/metrics")
    assert scraped.status_code == 200
    counted = {
        line.split(" ")[0]: line.split(" ")[1]
        for line in scraped.text.splitlines()
        if line.startswith("berth_auth_refusals_total{")
    }
    assert counted == {
        'berth_auth_refusals_total{code="invalid_token"}': "2.0",
        'berth_auth_refusals_total{code="unauthenticated"}': "1.0",
        'berth_auth_refusals_total{code="identity_provider_unavailable"}': "1.0",
    }
