"""An allocation's life through the API: created, placed, read, listed, released; and the states that refuse."""

from __future__ import annotations

import asyncio

from contracts.allocation import PLACING_STATES
from tests.api.stack import Stack


async def test_create_becomes_active_and_release_returns_the_gpus(stack: Stack) -> None:
    response = await stack.http.post(
        "/v1/allocations",
        json={
            "gpu_count": 2,
            "gpu_product": "h200",
            "shape": "gpu_slice",
            "labels": {"team": "search"},
            "ssh_public_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample user@host"],
        },
        headers=stack.acme,
    )
    assert response.status_code == 202, response.text
    accepted = response.json()
    # Its row's state: `pending`, or a step further where the workflow's first write beat the API's.
    assert accepted["state"] in PLACING_STATES
    assert accepted["workflow_id"] == f"allocation/{accepted['id']}"

    allocation = await stack.wait_for(accepted["id"], "active")
    for _ in range(50):  # `live` is best effort (a status query bounded by a second): a busy worker may miss one
        if allocation["live"]:
            break
        await asyncio.sleep(0.1)
        allocation = await stack.get(accepted["id"])
    assert (allocation["tenant"], allocation["region"], allocation["pool"], allocation["node"]) == (
        "acme",
        "lab",
        "lab-1/slices",
        "small",
    )
    assert allocation["live"] is True and allocation["step"] == "ready"
    assert [b["slot_index"] for b in allocation["bundles"]] == [0, 1]
    assert allocation["attempts"] == [{"number": 1, "node": "small", "outcome": "succeeded", "reason": None}]
    assert [e["step"] for e in allocation["events"]][-1] == "ready"
    assert allocation["failure_reason"] is None

    listed = await stack.http.get("/v1/allocations", params={"state": "active", "node": "small"}, headers=stack.acme)
    assert [a["id"] for a in listed.json()["allocations"]] == [accepted["id"]]
    assert (await stack.http.get("/v1/allocations", params={"node": "big"}, headers=stack.acme)).json() == {
        "allocations": [],
        "next_cursor": None,
    }

    released = await stack.http.delete(f"/v1/allocations/{accepted['id']}", headers=stack.acme)
    assert released.status_code == 202, released.text
    final = await stack.wait_for(accepted["id"], "released")
    assert final["live"] is False and final["bundles"] == []
    assert [e["step"] for e in final["events"]][-2:] == ["release", "released"]
    assert await stack.lab.active_claims() == {}

    # A release sent again (its first answer lost, say) is told it is done; the trail records nothing more.
    again = await stack.http.delete(f"/v1/allocations/{accepted['id']}", headers=stack.acme)
    assert (again.status_code, again.json()["state"]) == (202, "released"), again.text
    assert [e["step"] for e in (await stack.get(accepted["id"]))["events"]][-2:] == ["release", "released"]


async def test_an_allocation_with_an_end_shows_it_and_is_extended_within_the_api(stack: Stack) -> None:
    """An allocation's end as a client sees it: `duration` or `ends_at` on create (one of them, in the future), the end
    in every read, `POST .../extend` moving it, and the refusals in the API's words."""
    both = await stack.http.post(
        "/v1/allocations",
        json={"gpu_count": 2, "duration": "2h", "ends_at": "2099-01-01T00:00:00Z"},
        headers=stack.acme,
    )
    assert both.status_code == 422 and "give duration or ends_at, not both" in both.text
    past = await stack.http.post(
        "/v1/allocations", json={"gpu_count": 2, "ends_at": "2020-01-01T00:00:00Z"}, headers=stack.acme
    )
    assert past.status_code == 422, past.text
    assert "ends_at 2020-01-01T00:00:00+00:00 is not in the future" in past.json()["error"]["message"]
    naive = await stack.http.post(
        "/v1/allocations", json={"gpu_count": 2, "ends_at": "2099-01-01T00:00:00"}, headers=stack.acme
    )
    assert naive.status_code == 422  # a time without an offset names no instant

    created = await stack.http.post("/v1/allocations", json={"gpu_count": 2, "duration": "2h"}, headers=stack.acme)
    assert created.status_code == 202, created.text
    allocation_id = created.json()["id"]
    active = await stack.wait_for(allocation_id, "active")
    assert active["ends_at"] is not None
    extend = f"/v1/allocations/{allocation_id}/extend"
    moved = await stack.http.post(extend, json={"by": "30m"}, headers=stack.acme)
    assert moved.status_code == 200, moved.text
    assert moved.json()["ends_at"] > active["ends_at"]
    earlier = await stack.http.post(extend, json={"until": active["ends_at"]}, headers=stack.acme)
    assert earlier.status_code == 409 and earlier.json()["error"]["code"] == "extend_refused"
    assert "is not later than the current end" in earlier.json()["error"]["message"]
    neither = await stack.http.post(extend, json={}, headers=stack.acme)
    assert neither.status_code == 422
    read = (await stack.http.get(f"/v1/allocations/{allocation_id}", headers=stack.acme)).json()
    assert read["ends_at"] == moved.json()["ends_at"]
    assert [e["step"] for e in read["events"]][-1] == "extended"

    assert (await stack.http.delete(f"/v1/allocations/{allocation_id}", headers=stack.acme)).status_code == 202
    await stack.wait_for(allocation_id, "released")
    gone = await stack.http.post(extend, json={"by": "1h"}, headers=stack.acme)
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "invalid_state"


async def test_explain_says_what_a_request_would_preempt_before_anything_is(stack: Stack) -> None:
    """Preemption's dry run: a request that does not fit now is told which allocations a preemption would displace
    (the admission pass's own rules), and nothing is told or held. Its own allocations are named by id."""
    spot = await stack.create(4, priority_class="spot")
    await stack.wait_for(spot, "active")  # on `big`, the only 4-GPU host
    asked = {"gpu_count": 4, "priority_class": "urgent", "region": "lab"}
    own = await stack.http.post("/v1/explain", json=asked, headers=stack.acme)
    assert own.status_code == 200, own.text
    preview = own.json()
    assert preview["placed"] is False and preview["refusal"]["code"] == "insufficient_capacity"
    assert preview["preemption"] == {
        "case": "capacity",
        "node": "big",
        "victims": [
            {"allocation_id": spot, "node": "big", "gpus": 4, "priority": 0, "rule": "of a preemptible PriorityClass"}
        ],
    }
    assert (await stack.get(spot))["state"] == "active"  # a dry run: nothing was told
    assert (await stack.http.delete(f"/v1/allocations/{spot}", headers=stack.acme)).status_code == 202
    await stack.wait_for(spot, "released")
