"""An allocation's life through the API: created, placed, read, listed, released; and the states that refuse."""

from __future__ import annotations

from tests.api.stack import Stack


async def test_create_becomes_active_and_release_returns_the_gpus(stack: Stack) -> None:
    response = await stack.http.post(
        "/v1/allocations",
        json={"gpu_count": 2, "gpu_product": "h200", "shape": "gpu_slice", "labels": {"team": "search"},
              "ssh_public_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample user@host"]},
        headers=stack.acme,
    )  # fmt: skip
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["state"] == "pending"
    assert accepted["workflow_id"] == f"allocation/{accepted['id']}"

    allocation = await stack.wait_for(accepted["id"], "active")
    assert (allocation["tenant"], allocation["region"], allocation["pool"], allocation["node"]) == (
        "acme", "lab", "lab-1/slices", "small",
    )  # fmt: skip
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

    again = await stack.http.delete(f"/v1/allocations/{accepted['id']}", headers=stack.acme)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "invalid_state"
    assert "released" in again.json()["error"]["message"]
