"""Every read of an allocation says the same once it is active: the API's answer, its row (the audit trail's state)
and the workflow's own account. A release sent as soon as it is `active` is taken at once, by the run that placed
it."""

from __future__ import annotations

from sqlalchemy import select

from bench.actions import run_histories
from store.models import AllocationRow
from tests.api.stack import Stack
from workflows.allocation import client as allocation_client


async def _row_state(stack: Stack, allocation_id: str) -> str | None:
    async with stack.lab.sessions() as session:
        return await session.scalar(select(AllocationRow.state).where(AllocationRow.id == allocation_id))


async def test_the_api_the_row_and_the_workflow_agree_once_it_is_active(stack: Stack) -> None:
    client = stack.lab.starter
    for _ in range(3):
        allocation_id = await stack.create(2)
        reads: list[tuple[str, str | None]] = []  # (path, state), in the order they were read
        while not reads or reads[-3][1] != "active":
            reads.append(("workflow", (await allocation_client.status(client, allocation_id)).state))
            reads.append(("api", (await stack.get(allocation_id))["state"]))
            reads.append(("row", await _row_state(stack, allocation_id)))
        for _ in range(5):
            reads += [
                ("api", (await stack.get(allocation_id))["state"]),
                ("row", await _row_state(stack, allocation_id)),
            ]
        # Once any path has said `active`, every later read says it: the row is written before the workflow answers
        # with the state, and the API answers with the workflow's account (or the row's, when it does not answer).
        first = next(n for n, (_path, state) in enumerate(reads) if state == "active")
        assert {state for _path, state in reads[first:]} == {"active"}, reads

        released = await stack.http.delete(f"/v1/allocations/{allocation_id}", headers=stack.acme)
        assert released.status_code == 202, released.text
        final = await stack.wait_for(allocation_id, "released")
        assert [e["step"] for e in final["events"]][-4:] == ["ready", "release_requested", "release", "released"]
        assert len(await run_histories(client, f"allocation/{allocation_id}")) == 1  # placed, held, released: one run
