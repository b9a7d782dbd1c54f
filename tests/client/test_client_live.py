"""Every method of `berth.Client` and `berth.AsyncClient` against the live stack (tests/client/conftest.py): typed
answers, long-poll waits, pages, errors with the API's codes, and `allocate` giving back what it took.

The clients are built with no arguments where a person would: the context file `berth up` writes is what they find.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import berth
from contracts.http import (
    AllocationAccepted,
    AllocationSummary,
    AuditView,
    CapacityAt,
    CapacityReport,
    DeploymentAccepted,
    DeploymentView,
    FleetApplied,
    NodeInfo,
    QueueList,
    ReservationView,
    TokenCreated,
    UsageReport,
    WhoAmI,
)
from contracts.placement import PlacementResult
from tests.api.stack import api_fleet
from tests.client.conftest import Live
from tests.workflows.deployment_lab import deployment


def test_allocations_from_create_to_release(live: Live) -> None:
    with berth.Client(tenant="acme") as client:
        assert client.url == live.url
        accepted = client.allocations.create(gpus=2, duration="1h")
        assert isinstance(accepted, AllocationAccepted)
        active = client.allocations.wait(accepted.id, timeout=60)
        assert isinstance(active, berth.Allocation)
        assert (active.state, active.node, active.tenant) == ("active", "small", "acme")
        assert active.address == next(b.private_ip for b in active.bundles if b.private_ip)
        assert client.allocations.get(accepted.id).id == accepted.id
        listed = list(client.allocations.list(state="active"))
        assert [a.id for a in listed] == [accepted.id] and isinstance(listed[0], AllocationSummary)

        before = active.ends_at
        assert before is not None
        extended = client.allocations.extend(accepted.id, by="30m")
        assert extended.ends_at == before + timedelta(minutes=30)

        assert client.allocations.release(accepted.id).id == accepted.id
        assert client.allocations.release(accepted.id).state in ("releasing", "released")  # idempotent: 202 again
        assert client.allocations.wait(accepted.id, "released", timeout=60).state == "released"


def test_cancel_retry_and_waiting_for_a_state_it_never_reaches(live: Live) -> None:
    with berth.Client() as admin:
        stuck = admin.allocations.create(gpus=1, tenant="acme")  # best fit: `slow`, which never boots
        with pytest.raises(berth.TimedOut):
            admin.allocations.wait(stuck.id, timeout=1)
        moved = admin.allocations.retry(stuck.id, exclude_nodes=["slow"])
        assert moved.id == stuck.id
        assert admin.allocations.wait(stuck.id, timeout=60).node != "slow"
        assert admin.allocations.cancel(stuck.id).id == stuck.id
        assert admin.allocations.cancel(stuck.id).id == stuck.id  # idempotent: 202 again
        with pytest.raises(berth.Ended) as ended:
            admin.allocations.wait(stuck.id, "active", "released", timeout=60)
        assert ended.value.code == "cancelled"


def test_pages_are_followed_to_the_end(live: Live) -> None:
    with berth.Client() as admin:
        nodes = list(admin.nodes.list(page_size=1))  # three hosts: three pages
        assert sorted(n.name for n in nodes) == ["big", "slow", "small"] and isinstance(nodes[0], NodeInfo)
        made = [admin.allocations.create(gpus=1, tenant="acme", queue="0").id for _ in range(3)]
        listed = [a.id for a in admin.allocations.list(page_size=2)]
        assert sorted(listed) == sorted(made) and len(listed) == len(set(listed))
        for allocation_id in made:
            admin.allocations.cancel(allocation_id)


def test_errors_carry_the_api_code_status_and_details(live: Live) -> None:
    with berth.Client(tenant="acme") as acme:
        with pytest.raises(berth.NotFound) as missing:
            acme.allocations.get("nope")
        assert (missing.value.code, missing.value.status) == ("not_found", 404)
        with pytest.raises(berth.InvalidRequest) as unknown:
            acme.explain(gpus=1, region="atlantis")
        assert unknown.value.code == "unknown_region" and unknown.value.status == 422 and unknown.value.details
        with pytest.raises(berth.Forbidden) as refused:
            acme.nodes.cordon("small")  # an operator's action
        assert refused.value.status == 403
    with berth.Client(live.url, "berth_not-a-token") as stranger, pytest.raises(berth.Unauthorized) as who:
        stranger.whoami()
    assert who.value.status == 401 and who.value.code


def test_the_rest_of_the_api(live: Live) -> None:
    now = datetime.now(UTC)
    with berth.Client() as admin:
        assert isinstance(admin.whoami(), WhoAmI) and admin.whoami().role == "admin"
        assert admin.auth_config().oidc is None
        assert admin.health().status == "ok"
        assert "berth_api_requests_total" in admin.metrics()
        assert isinstance(admin.capacity.now(region="lab"), CapacityReport)
        assert isinstance(admin.capacity.at(now + timedelta(hours=1), region="lab"), CapacityAt)
        placed = admin.explain(gpus=2, tenant="acme", detail=True)
        assert isinstance(placed, PlacementResult)
        assert isinstance(admin.queues.get(region="lab"), QueueList)
        assert isinstance(admin.usage(by=("tenant", "product"), start=now - timedelta(days=1)), UsageReport)
        raw = admin.request("GET", "/v1/whoami")
        assert raw.status_code == 200 and raw.json()["role"] == "admin"

        # Nodes.
        assert admin.nodes.get("big").name == "big"
        assert admin.nodes.cordon("big").status == "CORDONED"
        assert admin.nodes.uncordon("big").status == "READY"
        drained = admin.nodes.drain("big")
        assert drained.node.status == "DRAINING" and drained.told == []
        admin.nodes.uncordon("big")
        assert admin.nodes.repair("big", [0]).node == "big"  # nothing was unhealthy: nothing to repair
        unknown = {"agent": {"version": "test", "interval_seconds": 30}, "topology": "0" * 16}
        with pytest.raises(berth.NotFound):
            admin.nodes.report("nope", unknown)

        # Tokens, and a node's report with its own.
        token = admin.tokens.create(node="slow", label="client test", expires_in="1d")
        assert isinstance(token, TokenCreated) and token.token
        assert token.id in [t.id for t in admin.tokens.list()]
        with berth.Client(live.url, token.token) as agent:
            reply = agent.nodes.report("slow", unknown)
        assert reply["node"] == "slow"
        member = admin.tokens.create(tenant="globex", role="viewer")
        assert admin.tokens.revoke(member.id).revoked == [member.id]
        with pytest.raises(berth.NotFound):
            admin.tokens.revoke(member.id)
        assert token.id in admin.tokens.revoke_node("slow").revoked
        assert member.id in [t.id for t in admin.tokens.list(all=True)]

        # The fleet: a dry run changes nothing; the same file again changes nothing either.
        dry = admin.fleet.apply(api_fleet(), dry_run=True)
        assert isinstance(dry, FleetApplied) and dry.dry_run
        assert admin.fleet.apply(api_fleet()).changes == []

        # Reservations.
        reservation = admin.reservations.create(
            gpu_count=1, region="lab", tenant="acme", starts_at=now + timedelta(hours=2), duration="1h"
        )
        assert isinstance(reservation, ReservationView) and reservation.state == "reserved"
        assert admin.reservations.get(reservation.id).id == reservation.id
        assert reservation.id in [r.id for r in admin.reservations.list()]
        assert admin.reservations.wait(reservation.id, "reserved", timeout=10).id == reservation.id
        admin.reservations.cancel(reservation.id)
        assert admin.reservations.wait(reservation.id, "cancelled", timeout=60).state == "cancelled"

        # Deployments, in the default namespace and in another.
        accepted = admin.deployments.apply(deployment("llama", 1))
        assert isinstance(accepted, DeploymentAccepted) and accepted.created
        view = admin.deployments.get("llama")
        assert isinstance(view, DeploymentView) and view.namespace == "default"
        admin.deployments.wait("llama", "pending", "reconciling", "steady", timeout=60)
        other = admin.deployments.apply(deployment("llama", 1), namespace="research")
        assert other.created
        assert admin.deployments.get("llama", namespace="research").namespace == "research"
        assert sorted(d.namespace for d in admin.deployments.list(page_size=1)) == ["default", "research"]
        admin.deployments.delete("llama", namespace="research")
        admin.deployments.delete("llama")

        # The audit.
        assert isinstance(admin.audit.run(), AuditView)
        assert admin.audit.latest().ran
        assert any(r.route == "/v1/tokens" for r in admin.audit.requests(limit=100))


def test_allocate_gives_back_what_it_took_even_when_the_block_raises(live: Live) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with berth.allocate(gpus=2, tenant="acme", duration="1h") as alloc:
            assert alloc.state == "active" and alloc.address is not None
            taken = alloc.id
            raise Boom
    with berth.Client() as admin:
        assert admin.allocations.wait(taken, "released", timeout=60).state == "released"


async def test_the_async_client_is_the_same_client(live: Live) -> None:
    async with berth.AsyncClient(tenant="acme") as client:
        assert (await client.whoami()).kind == "token"
        async with client.allocate(gpus=2, duration="1h") as alloc:
            assert alloc.state == "active" and alloc.node == "small"
            seen = [a.id async for a in client.allocations.list(page_size=1)]
            assert alloc.id in seen
        assert (await client.allocations.wait(alloc.id, "released", timeout=60)).state == "released"
        with pytest.raises(berth.NotFound):
            await client.allocations.get("nope")
