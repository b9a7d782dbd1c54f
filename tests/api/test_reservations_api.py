"""Reservations through the API against a real stack: a window admitted on the node that can hold
it then, a full window refused with the nearest windows that fit, the reserved GPUs held from requests that would
overlap it, and at its start the reservation becomes an allocation on its node (a preemptible allocation there
preempted), which expires at its end."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from tests.api.stack import Stack


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def _reservation(stack: Stack, reservation_id: str, *states: str, timeout: float = 30) -> dict:
    for _ in range(int(timeout * 10)):
        seen = (await stack.http.get(f"/v1/reservations/{reservation_id}", headers=stack.acme)).json()
        if seen["state"] in states:
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"reservation {reservation_id} stayed {seen['state']} (wanted {states}): {seen['reason']}")


async def test_a_reservation_holds_its_window_preempts_spot_at_its_start_and_expires_at_its_end(stack: Stack) -> None:
    spot = await stack.create(4, priority_class="spot")
    await stack.wait_for(spot, "active")  # `big`'s 4 GPUs, preemptible
    window = {"region": "lab", "starts_at": _at(8), "duration": "3s"}

    # 2 GPUs: `small` (2 free) is left with the least room; `big`'s spot allocation would not count, 4 left there.
    first = await stack.http.post("/v1/reservations", json={"gpu_count": 2, **window}, headers=stack.acme)
    assert first.status_code == 201, first.text
    assert (first.json()["node"], first.json()["state"]) == ("small", "reserved")
    # 4 GPUs: only `big`, whose spot allocation will be preempted at the start.
    second = await stack.http.post("/v1/reservations", json={"gpu_count": 4, **window}, headers=stack.acme)
    assert second.status_code == 201 and second.json()["node"] == "big"
    # The window is full now: refused, with the nearest 3-second window that fits (when the first ones end).
    full = await stack.http.post("/v1/reservations", json={"gpu_count": 4, **window}, headers=stack.acme)
    assert full.status_code == 409 and full.json()["error"]["code"] == "window_full"
    assert "no node has 4 GPUs free in [" in full.json()["error"]["message"]
    nearest = full.json()["error"]["details"]["nearest_windows"]
    assert nearest and _instant(nearest[0]["starts_at"]) == _instant(second.json()["ends_at"])

    # The capacity view over time: now the spot allocation holds `big`; in the window, the reservations hold 6 GPUs.
    now = (await stack.http.get("/v1/capacity/at", params={"at": _at(0)}, headers=stack.acme)).json()
    slices = next(p for p in now["pools"] if p["pool"] == "lab-1/slices")
    assert (slices["gpus"], slices["held"], slices["reserved"], slices["free"]) == (7, 4, 0, 3)
    during = (await stack.http.get("/v1/capacity/at", params={"at": _at(9)}, headers=stack.acme)).json()
    slices = next(p for p in during["pools"] if p["pool"] == "lab-1/slices")
    assert (slices["reserved"], slices["largest_free"]) == (6, 1)  # `slow`'s 1 GPU is all that is left

    # Before the start, `small`'s 2 GPUs are held from a request with no end: it finds nowhere to go.
    held = await stack.create(2)
    failed = await stack.wait_for(held, "failed")
    assert "insufficient_capacity" in failed["failure_reason"] or "no_compatible" in failed["failure_reason"]

    # At the start: each reservation becomes an allocation on its node; the spot allocation is preempted first.
    for reservation in (first.json(), second.json()):
        started = await _reservation(stack, reservation["id"], "started", "ended")
        allocation = await stack.wait_for(started["allocation_id"], "active", timeout=30)
        assert allocation["node"] == reservation["node"] and allocation["ends_at"] is not None
    assert (await stack.wait_for(spot, "preempted"))["state"] == "preempted"

    # At the end: each allocation expires and its reservation has ended.
    for reservation in (first.json(), second.json()):
        ended = await _reservation(stack, reservation["id"], "ended")
        assert (await stack.get(ended["allocation_id"]))["state"] == "expired"
    assert await stack.lab.active_claims() == {}


async def test_a_reservation_is_its_tenants_alone_and_cancelled_before_its_start_holds_nothing(stack: Stack) -> None:
    window = {"gpu_count": 2, "region": "lab", "starts_at": _at(3600), "duration": "1h"}
    created = await stack.http.post("/v1/reservations", json=window, headers=stack.acme)
    assert created.status_code == 201, created.text
    reservation = created.json()["id"]
    # Another tenant neither sees it, nor can cancel it.
    assert (await stack.http.get(f"/v1/reservations/{reservation}", headers=stack.globex)).status_code == 404
    assert (await stack.http.delete(f"/v1/reservations/{reservation}", headers=stack.globex)).status_code == 404
    assert reservation not in [
        r["id"] for r in (await stack.http.get("/v1/reservations", headers=stack.globex)).json()["reservations"]
    ]
    in_the_past = await stack.http.post("/v1/reservations", json={**window, "starts_at": _at(-60)}, headers=stack.acme)
    assert in_the_past.status_code == 422 and "is not in the future" in in_the_past.json()["error"]["message"]

    assert (await stack.http.delete(f"/v1/reservations/{reservation}", headers=stack.acme)).status_code == 202
    assert (await _reservation(stack, reservation, "cancelled"))["allocation_id"] is None
    again = await stack.http.delete(f"/v1/reservations/{reservation}", headers=stack.acme)
    assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_state"
    # Its hold is gone: a request with no end takes `small` again.
    placed = await stack.create(2)
    assert (await stack.wait_for(placed, "active"))["node"] == "small"
    assert (await stack.http.delete(f"/v1/allocations/{placed}", headers=stack.acme)).status_code == 202
    await stack.wait_for(placed, "released")


async def test_an_allocation_is_extended_only_up_to_the_start_of_a_reservation_that_needs_its_gpus(
    stack: Stack,
) -> None:
    leased = await stack.create(4, duration="30m")
    active = await stack.wait_for(leased, "active")  # `big`'s 4 GPUs, the only node with 4
    assert active["node"] == "big"
    starts = datetime.now(UTC) + timedelta(hours=2)
    window = {"gpu_count": 4, "region": "lab", "starts_at": starts.isoformat(), "duration": "1h"}
    created = await stack.http.post("/v1/reservations", json=window, headers=stack.acme)
    assert created.status_code == 201 and created.json()["node"] == "big"  # the allocation ends before it starts

    # An hour more still ends before the window: granted.
    extend = f"/v1/allocations/{leased}/extend"
    longer = await stack.http.post(extend, json={"by": "1h"}, headers=stack.acme)
    assert longer.status_code == 200, longer.text
    # Past the window's start: refused, saying how late it may end, never whose reservation it is.
    past = await stack.http.post(extend, json={"by": "1h"}, headers=stack.acme)
    assert past.status_code == 409 and past.json()["error"]["code"] == "extend_refused"
    message = past.json()["error"]["message"]
    assert message.startswith("a reservation needs 4 GPUs of big from ") and "at the latest" in message
    assert "acme" not in message and created.json()["id"] not in message
    # Up to the start itself: granted; the allocation's end is what the API shows, and what admission counts.
    until = await stack.http.post(extend, json={"until": starts.isoformat()}, headers=stack.acme)
    assert until.status_code == 200, until.text
    assert _instant((await stack.get(leased))["ends_at"]) == starts
    before = {**window, "starts_at": (starts - timedelta(minutes=15)).isoformat(), "duration": "10m"}
    overlapping = await stack.http.post("/v1/reservations", json=before, headers=stack.acme)
    assert overlapping.status_code == 409 and overlapping.json()["error"]["code"] == "window_full"

    assert (await stack.http.delete(f"/v1/reservations/{created.json()['id']}", headers=stack.acme)).status_code == 202
    assert (await stack.http.delete(f"/v1/allocations/{leased}", headers=stack.acme)).status_code == 202
    await stack.wait_for(leased, "released")


async def test_a_reservation_whose_workflow_was_terminated_is_reported_and_closed_by_a_cancel(stack: Stack) -> None:
    window = {"gpu_count": 4, "region": "lab", "starts_at": _at(3600), "duration": "1h"}
    created = (await stack.http.post("/v1/reservations", json=window, headers=stack.acme)).json()
    reservation = created["id"]
    assert (await stack.http.post("/v1/audit", headers=stack.admin)).json()["counts"] == {}

    # Terminated from the Temporal UI: nothing will start or end it, and its row still promises `big`.
    await stack.lab.starter.get_workflow_handle(created["workflow_id"]).terminate("an operator's mistake")
    audit = (await stack.http.post("/v1/audit", headers=stack.admin)).json()
    assert audit["counts"] == {"abandoned_reservation": 1}
    [finding] = audit["report"]["findings"]
    assert (finding["node"], finding["repair"]) == ("big", None)  # reported, not repaired
    assert f"berth reservations cancel {reservation}" in finding["message"]

    # The cancel closes the row itself (no workflow runs to do it), and the window is free again.
    cancelled = await stack.http.delete(f"/v1/reservations/{reservation}", headers=stack.acme)
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    assert (await stack.http.post("/v1/audit", headers=stack.admin)).json()["counts"] == {}
    again = await stack.http.post("/v1/reservations", json=window, headers=stack.acme)
    assert again.status_code == 201 and again.json()["node"] == "big"


async def test_a_spot_allocation_may_use_reserved_gpus_until_the_start_preempts_it(stack: Stack) -> None:
    window = {"gpu_count": 4, "region": "lab", "starts_at": _at(10), "duration": "3s"}
    created = await stack.http.post("/v1/reservations", json=window, headers=stack.acme)
    assert created.status_code == 201 and created.json()["node"] == "big"
    # `big`'s 4 GPUs are promised from the start: a request with no end finds no node with 4 free...
    plain = await stack.create(4)
    assert "insufficient_capacity" in (await stack.wait_for(plain, "failed"))["failure_reason"]
    # ...but a preemptible one may use them until then: the start preempts it.
    spot = await stack.create(4, priority_class="spot")
    assert (await stack.wait_for(spot, "active"))["node"] == "big"
    started = await _reservation(stack, created.json()["id"], "started", "ended")
    assert (await stack.wait_for(spot, "preempted"))["state"] == "preempted"
    assert (await stack.wait_for(started["allocation_id"], "active", "expired"))["node"] == "big"
    await _reservation(stack, created.json()["id"], "ended")
    assert await stack.lab.active_claims() == {}
