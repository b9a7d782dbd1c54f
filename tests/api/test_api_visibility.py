"""Allocations made through the API are listed and filtered in Temporal's visibility (the Temporal UI's list)."""

from __future__ import annotations

import asyncio

from temporalio.client import Client

from tests.api.stack import Stack

QUERY = 'BerthState="active" AND BerthTenant="acme"'


async def test_visibility_query_lists_active_allocations_of_a_tenant(stack: Stack, temporal_client: Client) -> None:
    # The 1-GPU request goes first, while every host is whole: best fit then puts it on `slow`, where it never
    # boots. (Placed after the others, it would rightly prefer a host they had already broken into.)
    released = await stack.create(1)
    await stack.wait_for(released, "waiting_ready")
    active = await stack.create(2)
    theirs = await stack.create(2, who=stack.globex)
    for allocation_id in (active, theirs):
        await stack.wait_for(allocation_id, "active")
    assert (await stack.http.post(f"/v1/allocations/{released}/cancel", headers=stack.acme)).status_code == 202
    await stack.wait_for(released, "cancelled")

    ours = {f"allocation/{i}" for i in (active, released, theirs)}
    deadline = asyncio.get_running_loop().time() + 10
    while True:  # visibility is eventually consistent
        listed = {w.id async for w in temporal_client.list_workflows(QUERY)} & ours
        if listed == {f"allocation/{active}"} or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert listed == {f"allocation/{active}"}
