"""`GET /v1/queues`, an allocation's `queue` place and the queue metrics.

The queues are written straight into PostgreSQL as the allocation workflows and admission passes write them
(`store.queue.enter`, `record_pass`): no workflow runs, so nothing moves while the test reads. The fleet: region
`lab` (nodes `small`, 2 H200, and `big`, 4) and region `east` (node `e1`, 4 H200): 10 H200 GPUs in all. Tenants
`acme` (weight 1), `globex` (weight 2) and `initech` (weight 1, region `lab` only).

Who holds what: acme 2 GPUs active on `e1` and 1 set aside on `small` for its queued `a-first`; globex 4 GPUs
active on `big`; initech nothing. No tenant is in a cohort, so none borrows and every share is 0: the order is
Kueue's classic one (within nominal quota first, then priority, then arrival), whatever each holds.

Region `lab`'s queue, in order of arrival, and the admission order expected:
    a-first   acme     priority 0 (batch)   -> 2nd: the earliest arrival at priority 0
    g-first   globex   priority 0           -> 3rd
    i-first   initech  priority 0           -> 4th
    a-urgent  acme     priority 100 (urgent)-> 1st: priority goes first
    g-second  globex   priority 0           -> 5th
Region `east`: x-east (acme).
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client

from contracts.placement import PlacementRequest
from contracts.task_queues import Queues
from fleet.loader import load_fleet
from store import queue
from store.apply import apply_fleet
from store.models import AllocationRow
from store.tokens import create_token, ensure_tenant_tokens
from tests.api.stack import app_for, bearer, http_client
from tests.workflows.lab import lab_fleet

LAB_ORDER = ["a-urgent", "a-first", "g-first", "i-first", "g-second"]
HEAD_REASON = "lab: no node can take 4 H200 GPU slices now (no candidate node)"
QUOTA_REASON = "quota: tenant initech would exceed its GPU quota: 0 active + 0 in flight + 1 requested > quota 0"


def _doc(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "berth.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def queue_fleet() -> str:
    """Region `lab` (the lab fleet's `small` and `big`, and an empty A100 pool), region `east` (`e1`), three
    tenants, two PriorityClasses."""
    lab = lab_fleet({"small": {"gpus": 2}, "big": {"gpus": 4}})
    lab_documents = list(yaml.safe_load_all(lab))
    for document in lab_documents:  # and a pool of another product with no node yet: it serves none of the queue
        if document["kind"] == "InferenceCluster":
            a100 = {"name": "a100", "className": "h200", "shape": "gpu_slice", "gpuProduct": "A100", "nodes": []}
            document["spec"]["nodePools"].append(a100)
    lab = yaml.safe_dump_all(lab_documents, sort_keys=False)
    east = [d for d in yaml.safe_load_all(lab_fleet({"e1": {"gpus": 4}})) if d["kind"] == "InferenceCluster"]
    cluster = east[0]
    cluster["metadata"]["name"], cluster["spec"]["region"] = "east-1", "east"
    for slot in cluster["spec"]["nodePools"][0]["nodes"][0]["slots"]:
        slot["mac"], slot["privateIp"] = f"52:54:00:ee:00:{slot['index']:02x}", f"10.9.0.{10 + slot['index']}"
    documents = [
        cluster,
        _doc("Region", "east", {"prices": {"H200": 3.0}}),
        _doc("Tenant", "globex", {"gpuQuota": 64, "weight": 2}),
        _doc("Tenant", "initech", {"gpuQuota": 64, "allowedRegions": ["lab"]}),
        _doc("PriorityClass", "urgent", {"value": 100}),
        _doc("PriorityClass", "batch", {"value": 0, "default": True}),
    ]
    return lab + "---\n" + yaml.safe_dump_all(documents, sort_keys=False)


def _row(allocation_id: str, tenant: str, state: str, gpus: int, node: str | None = None) -> AllocationRow:
    return AllocationRow(
        id=allocation_id,
        tenant=tenant,
        state=state,
        shape="gpu_slice",
        gpu_count=gpus,
        gpu_product="H200",
        request={"gpu_count": gpus, "gpu_product": "H200"},
        workflow_id=f"allocation/{allocation_id}",
        region="east" if node == "e1" else "lab" if node else None,
        node_id=node,
    )


QUEUED = [  # allocation, tenant, region, priority, class, GPUs: in order of arrival
    ("a-first", "acme", "lab", 0, "batch", 1),
    ("g-first", "globex", "lab", 0, None, 2),
    ("i-first", "initech", "lab", 0, None, 1),
    ("a-urgent", "acme", "lab", 100, "urgent", 4),
    ("g-second", "globex", "lab", 0, None, 1),
    ("x-east", "acme", "east", 0, None, 2),
]


async def write_queues(sessions: async_sessionmaker[AsyncSession]) -> None:
    """The allocations, the queues and what the last admission pass decided, as described above."""
    deadline = datetime.now(UTC) + timedelta(hours=1)
    async with sessions.begin() as session:
        session.add_all(
            [_row("held-acme", "acme", "active", 2, "e1"), _row("held-globex", "globex", "active", 4, "big")]
        )
        session.add_all(_row(allocation_id, tenant, "queued", gpus) for allocation_id, tenant, _, _, _, gpus in QUEUED)
    for allocation_id, tenant, region, priority, name, gpus in QUEUED:  # one transaction each: arrival is their order
        async with sessions.begin() as session:
            request = PlacementRequest(gpu_count=gpus, gpu_product="H200", region=region, tenant=tenant)
            await queue.enter(
                session,
                allocation_id=allocation_id,
                tenant=tenant,
                region=region,
                priority=priority,
                priority_class=name,
                request=request.model_dump(mode="json"),
                gpu_count=gpus,
                deadline_at=deadline,
                reason="no node can take it now",
                code="insufficient_capacity",
            )
    async with sessions.begin() as session:
        await queue.forget_set_asides(session, "lab")
        await queue.record_pass(
            session,
            [
                queue.PassRecord("a-urgent", None, "big", HEAD_REASON, "insufficient_capacity"),
                queue.PassRecord("i-first", None, None, QUOTA_REASON, "quota_exceeded"),
                queue.PassRecord(
                    "g-first",
                    None,
                    None,
                    "behind 1 request(s): the head, a-urgent, does not fit (StrictFIFO)",
                    "queued_behind",
                ),
                queue.PassRecord("g-second", None, None, None, None),
                queue.PassRecord("a-first", "small", None, None, None),
            ],
        )
        # g-first has waited a minute and a half, the others a moment.
        await session.execute(
            text("UPDATE queue_entries SET enqueued_at = now() - interval '90 seconds' WHERE allocation_id = 'g-first'")
        )


Who = dict[str, dict[str, str]]


@pytest.fixture
async def api(
    sessions: async_sessionmaker[AsyncSession], temporal_client: Client, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, Who]]:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(queue_fleet())
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([fleet_file]))
        tokens = {"admin": await create_token(session, "admin")} | await ensure_tenant_tokens(session)
    await write_queues(sessions)
    # Reads only: Temporal is asked for the live status of workflows that do not exist, and answers at once.
    app = app_for(sessions, temporal_client, Queues(control="unused", node_prefix="unused."))
    async with http_client(app) as http:
        yield http, {who: bearer(token) for who, token in tokens.items()}


async def _queues(http: httpx.AsyncClient, who: dict[str, str], **params: str) -> dict[str, Any]:
    response = await http.get("/v1/queues", params=params, headers=who)
    assert response.status_code == 200, response.text
    return response.json()


async def test_an_admin_sees_every_queue_in_admission_order(api: tuple[httpx.AsyncClient, Who]) -> None:
    http, who = api
    regions = (await _queues(http, who["admin"]))["regions"]
    assert [(r["region"], r["strategy"], r["length"]) for r in regions] == [
        ("east", "BestEffortFIFO", 1),
        ("lab", "BestEffortFIFO", 5),
    ]
    lab = regions[1]["entries"]
    # priority first, then arrival: no tenant borrows, so what each holds does not count
    assert [(e["position"], e["allocation_id"]) for e in lab] == list(enumerate(LAB_ORDER, start=1))
    assert [(e["tenant"], e["priority"], e["priority_class"], e["share"]) for e in lab] == [
        ("acme", 100, "urgent", 0.0),
        ("acme", 0, "batch", 0.0),
        ("globex", 0, None, 0.0),
        ("initech", 0, None, 0.0),
        ("globex", 0, None, 0.0),
    ]
    assert [(e["gpu_count"], e["gpu_product"], e["shape"]) for e in lab][:2] == [
        (4, "H200", "gpu_slice"),
        (1, "H200", "gpu_slice"),
    ]
    # why each is not placed yet: what the last pass recorded, in one line
    assert [(e["code"], e["node"], e["reserved_node"], e["status"]) for e in lab] == [
        ("insufficient_capacity", None, "big", f"head of the queue: node big is reserved for it; {HEAD_REASON}"),
        (None, "small", None, "being placed on small"),
        ("queued_behind", None, None, "behind 1 request(s): the head, a-urgent, does not fit (StrictFIFO)"),
        ("quota_exceeded", None, None, QUOTA_REASON),
        (None, None, None, "waiting for the next admission pass"),
    ]
    waited = {e["allocation_id"]: e["waited_seconds"] for e in lab}
    assert 90 <= waited["g-first"] < 150 and all(0 <= waited[a] < 60 for a in LAB_ORDER if a != "g-first")
    east = regions[0]["entries"]
    assert [(e["position"], e["allocation_id"], e["tenant"], e["region"]) for e in east] == [
        (1, "x-east", "acme", "east")
    ]


async def test_a_tenant_sees_its_own_requests_at_their_places_in_the_whole_queue(
    api: tuple[httpx.AsyncClient, Who],
) -> None:
    http, who = api
    response = await http.get("/v1/queues", headers=who["globex"])
    assert response.status_code == 200, response.text
    regions = response.json()["regions"]
    assert [(r["region"], r["length"], [e["allocation_id"] for e in r["entries"]]) for r in regions] == [
        ("east", 1, []),  # a region globex may use, whose queue holds none of its requests
        ("lab", 5, ["g-first", "g-second"]),
    ]
    assert [(e["position"], e["share"]) for e in regions[1]["entries"]] == [(3, 0.0), (5, 0.0)]
    first = regions[1]["entries"][0]
    assert (
        first["reason"]
        == first["status"]
        == ("behind 1 request(s): the head, a request of another tenant, does not fit (StrictFIFO)")
    )
    for other in ("a-urgent", "a-first", "i-first", "x-east", "held-acme"):  # no other tenant's id anywhere
        assert other not in response.text

    initech = (await _queues(http, who["initech"]))["regions"]  # east is not a region initech may use
    assert [(r["region"], [(e["position"], e["allocation_id"]) for e in r["entries"]]) for r in initech] == [
        ("lab", [(4, "i-first")])
    ]


async def test_the_region_filter_and_an_unknown_region(api: tuple[httpx.AsyncClient, Who]) -> None:
    http, who = api
    east = (await _queues(http, who["admin"], region="east"))["regions"]
    assert [(r["region"], [e["allocation_id"] for e in r["entries"]]) for r in east] == [("east", ["x-east"])]
    lab = (await _queues(http, who["acme"], region="lab"))["regions"]
    assert [(e["position"], e["allocation_id"]) for e in lab[0]["entries"]] == [(1, "a-urgent"), (2, "a-first")]

    unknown = await http.get("/v1/queues", params={"region": "nowhere"}, headers=who["admin"])
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["error"] == {
        "code": "unknown_region",
        "message": "region 'nowhere' does not exist in the fleet; choose one of: east, lab",
        "details": [{"field": "query.region", "value": "nowhere", "choices": ["east", "lab"]}],
    }
    # A region the tenant may not use is answered exactly as one that does not exist.
    hidden = await http.get("/v1/queues", params={"region": "east"}, headers=who["initech"])
    assert hidden.status_code == 422 and hidden.json()["error"]["details"][0]["choices"] == ["lab"]
    unauthenticated = await http.get("/v1/queues")
    assert unauthenticated.status_code == 401


async def test_the_pool_filter_shows_what_a_pool_could_serve_at_its_places_in_the_regions_queue(
    api: tuple[httpx.AsyncClient, Who],
) -> None:
    http, who = api
    slices = (await _queues(http, who["admin"], pool="lab-1/slices"))["regions"]
    assert [(r["region"], r["length"]) for r in slices] == [("lab", 5)]
    assert [e["allocation_id"] for e in slices[0]["entries"]] == LAB_ORDER
    a100 = (await _queues(http, who["admin"], pool="lab-1/a100"))["regions"]
    assert [(r["region"], r["length"], r["entries"]) for r in a100] == [("lab", 5, [])]  # every request wants H200
    mine = (await _queues(http, who["globex"], pool="lab-1/slices"))["regions"][0]["entries"]
    assert [(e["position"], e["allocation_id"]) for e in mine] == [(3, "g-first"), (5, "g-second")]

    response = await http.get("/v1/queues", params={"pool": "lab-1/gpus"}, headers=who["admin"])
    assert response.status_code == 422 and response.json()["error"]["code"] == "unknown_pool"
    assert response.json()["error"]["message"] == (
        "pool 'lab-1/gpus' does not exist in the fleet; choose one of: east-1/slices, lab-1/a100, lab-1/slices"
    )
    response = await http.get("/v1/queues", params={"pool": "east-1/slices"}, headers=who["initech"])
    assert response.status_code == 422 and response.json()["error"]["code"] == "unknown_pool"  # not its region
    response = await http.get("/v1/queues", params={"pool": "east-1/slices", "region": "lab"}, headers=who["admin"])
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "pool east-1/slices is in region east, not lab"


async def test_an_allocation_tells_its_place_in_the_queue(api: tuple[httpx.AsyncClient, Who]) -> None:
    http, who = api
    response = await http.get("/v1/allocations/g-first", headers=who["globex"])
    assert response.status_code == 200, response.text
    detail = response.json()
    assert detail["state"] == "queued"
    place = detail["queue"]
    assert {k: place[k] for k in ("position", "region", "priority", "priority_class", "code", "node")} == {
        "position": 3,
        "region": "lab",
        "priority": 0,
        "priority_class": None,
        "code": "queued_behind",
        "node": None,
    }
    assert place["reason"] == "behind 1 request(s): the head, a request of another tenant, does not fit (StrictFIFO)"
    assert 90 <= place["waited_seconds"] < 150 and place["deadline_at"] > place["enqueued_at"]

    head = (await http.get("/v1/allocations/a-urgent", headers=who["acme"])).json()["queue"]
    assert (head["position"], head["reserved_node"], head["priority_class"]) == (1, "big", "urgent")
    placing = (await http.get("/v1/allocations/a-first", headers=who["acme"])).json()["queue"]
    assert (placing["position"], placing["status"]) == (2, "being placed on small")
    held = (await http.get("/v1/allocations/held-acme", headers=who["acme"])).json()
    assert held["queue"] is None


async def test_the_metrics_count_each_queue_and_its_longest_wait(api: tuple[httpx.AsyncClient, Who]) -> None:
    http, _ = api
    response = await http.get("/metrics")
    assert response.status_code == 200
    lengths = dict(re.findall(r"^berth_queue_length\{(.*)\} (\S+)$", response.text, re.MULTILINE))
    assert lengths == {
        'priority="100",region="lab",tenant="acme"': "1.0",
        'priority="0",region="lab",tenant="acme"': "1.0",
        'priority="0",region="lab",tenant="globex"': "2.0",
        'priority="0",region="lab",tenant="initech"': "1.0",
        'priority="0",region="east",tenant="acme"': "1.0",
    }
    waits = dict(re.findall(r"^berth_queue_longest_wait_seconds\{(.*)\} (\S+)$", response.text, re.MULTILINE))
    assert waits.keys() == lengths.keys()
    assert 90 <= float(waits['priority="0",region="lab",tenant="globex"']) < 150
    assert float(waits['priority="0",region="lab",tenant="initech"']) < 60


@pytest.fixture
async def remembering(
    sessions: async_sessionmaker[AsyncSession], temporal_client: Client, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, Who]]:
    """The same queues, the three tenants in one cohort tree whose root orders by usage decayed with a one-hour
    half-life; acme held 4 GPUs from 130 to 10 minutes ago, globex (weight 2) 2 GPUs from 90 to 30 minutes ago."""
    documents = list(yaml.safe_load_all(queue_fleet()))
    for document in documents:
        if document["kind"] == "Tenant":
            document["spec"]["cohort"] = "org"
    documents.append(_doc("Cohort", "org", {"fairSharing": {"enabled": True, "usageHalfLife": "1h"}}))
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([fleet_file]))
        tokens = {"admin": await create_token(session, "admin")} | await ensure_tenant_tokens(session)
        for tenant, gpus, start, end in (("acme", 4, 130, 10), ("globex", 2, 90, 30)):
            await session.execute(
                text(
                    "INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpus, started_at, ended_at) "
                    "VALUES ('allocation', :s, 1, :t, :g, now() - make_interval(mins => :a), "
                    "now() - make_interval(mins => :b))"
                ),
                {"s": f"past-{tenant}", "t": tenant, "g": gpus, "a": start, "b": end},
            )
    await write_queues(sessions)
    app = app_for(sessions, temporal_client, Queues(control="unused", node_prefix="unused."))
    async with http_client(app) as http:
        yield http, {who: bearer(token) for who, token in tokens.items()}


async def test_a_tree_that_remembers_orders_by_decayed_usage_and_shows_it(
    remembering: tuple[httpx.AsyncClient, Who],
) -> None:
    """Kueue's admission fair sharing, as `berth queue` shows it: the tenant that used least lately (over its
    weight) first, whatever the priority; each entry shows its tenant's decayed GPU-hours."""
    http, who = remembering
    lab = (await _queues(http, who["admin"], region="lab"))["regions"][0]["entries"]
    assert [e["allocation_id"] for e in lab] == ["i-first", "g-first", "g-second", "a-urgent", "a-first"]

    def by_hand(gpus: int, start_min: float, end_min: float) -> float:  # GPU-hours, half-life one hour
        return gpus / math.log(2) * (2 ** (-end_min / 60) - 2 ** (-start_min / 60))

    used = {e["tenant"]: e["decayed_gpu_hours"] for e in lab}
    assert used["initech"] == 0.0
    assert used["acme"] == pytest.approx(by_hand(4, 130, 10), rel=1e-3)
    assert used["globex"] == pytest.approx(by_hand(2, 90, 30), rel=1e-3)
    own = (await _queues(http, who["globex"], region="lab"))["regions"][0]["entries"]
    assert [e["position"] for e in own] == [2, 3]  # read a moment later: what it used has decayed a little more
    assert [e["decayed_gpu_hours"] for e in own] == pytest.approx([used["globex"]] * 2, rel=1e-3)


async def test_each_waiting_request_says_what_would_let_it_through(api: tuple[httpx.AsyncClient, Who]) -> None:
    """From what the API knows: the leases ending on the nodes it could use (another tenant's named only as such),
    for a quota refusal its own tenant's allocations' ends, and "nothing known" rather than a guess."""
    http, who = api
    lab = {e["allocation_id"]: e for e in (await _queues(http, who["admin"], region="lab"))["regions"][0]["entries"]}
    assert lab["a-first"]["unblock"] == []  # being placed
    assert [h["kind"] for h in lab["i-first"]["unblock"]] == ["nothing_known"]  # initech holds nothing that ends
    for entry in lab.values():
        for hint in entry["unblock"]:
            assert hint["kind"] in {"release", "reclaim", "reservation_end", "node_return", "quota", "nothing_known"}
            assert hint["text"]
    globex = (await _queues(http, who["globex"], region="lab"))["regions"][0]["entries"]
    texts = " ".join(h["text"] for e in globex for h in e["unblock"])
    assert "acme" not in texts and "held-acme" not in texts


async def test_usage_gives_each_tenants_standing_in_fair_sharing(api: tuple[httpx.AsyncClient, Who]) -> None:
    http, who = api
    admin = await http.get("/v1/usage", headers=who["admin"])
    assert admin.status_code == 200, admin.text
    standings = {s["tenant"]: s for s in admin.json()["fair_shares"]}
    assert {"acme", "globex", "initech"} <= set(standings)
    assert standings["globex"]["weight"] == 2 and standings["acme"]["cohort"] is None
    assert standings["acme"]["share"] == 0.0 and standings["acme"]["decayed_gpu_hours"] is None
    mine = await http.get("/v1/usage", headers=who["globex"])
    assert [s["tenant"] for s in mine.json()["fair_shares"]] == ["globex"]
