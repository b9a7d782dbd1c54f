"""Allocations with an end, against real PostgreSQL and Temporal: the owner is warned before the
end, the end runs the release saga and the allocation ends `expired`; an extension moves the end, up to the pool's
`maxLease`; a pool with a `maxLease` takes no request for longer, and gives an allocation with no end its own.

The expiry runs in the session's time-skipping dev server (started through `temporal_env.client`): a 48-hour lease
with the default 15-minute warning passes in moments. The others use real seconds."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.actions import Actions, count_actions, run_histories
from contracts.allocation import Lease
from store.models import AllocationRow
from tests.ledger import billed
from tests.workflows.lab import FAST, lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import ExtendRequest
from workflows.allocation.workflow import AllocationWorkflow
from workflows.search_attributes import ENDS_AT, EXPIRING, STATE

HISTORIES = Path(__file__).parent / "histories"


async def test_an_allocation_is_warned_then_expires_and_gives_everything_back(
    temporal_env, temporal_client, sessions, tmp_path: Path
) -> None:
    fleet = lab_fleet({"n1": {"gpus": 2}})
    async with running_lab(temporal_env.client, temporal_client, sessions, tmp_path, fleet) as lab:
        handle = await lab.allocate("short", gpus=2, timing=FAST, lease=Lease(duration_seconds=48 * 3600))
        active = await lab.wait_for_state(handle, "active")
        assert active.ends_at is not None and not active.expiry_warned
        described = (await handle.describe()).typed_search_attributes
        assert described.get(ENDS_AT) == active.ends_at and described.get(EXPIRING) is False
        extended = await allocation_client.extend(temporal_client, "short", ExtendRequest(seconds=3600))
        assert extended.ends_at == active.ends_at + timedelta(hours=1)
        result = await handle.result()
        assert result.state == "expired"
        steps = [(step, state) for step, state, _node, _reason in await lab.events("short")]
        assert steps[-5:] == [
            ("ready", "active"),
            ("extended", "active"),
            ("expiring", "active"),
            ("expire", "releasing"),
            ("expired", "expired"),
        ]
        assert await lab.actors("short") == {"expiring": "berth:expiry", "expire": "berth:expiry"}
        reasons = {step: reason for step, _state, _node, reason in await lab.events("short")}
        assert reasons["expiring"] == f"ends at {extended.ends_at.isoformat()}; extend it to keep it"
        assert await lab.active_claims() == {} and lab.vm_records() == []
        assert set((await lab.slot_states()).values()) == {"available"}
        final = (await handle.describe()).typed_search_attributes
        assert (final.get(STATE), final.get(EXPIRING)) == ("expired", True)
        async with sessions() as session:
            row = await session.get(AllocationRow, "short")
            assert (row.state, row.ends_at) == ("expired", extended.ends_at)
        # Billed from the claim to the release its end ran (PostgreSQL's clock, which Temporal's skipping does not move).
        assert await billed(sessions, "short") == [(1, 2, "expired")]
        histories = await run_histories(temporal_client, "allocation/short")
    assert len(histories) == 1  # placed and held until its end in one run: its page tells the whole story
    # Its end rides with `active` in one upsert: the same actions to active as an allocation without an end, but for
    # the timer that ends it.
    actions = count_actions(histories)
    assert (Actions.count(actions.to_active), actions.to_active["upsert"], actions.to_active["timer"]) == (9, 2, 1)
    for history in histories:  # and the hold's timers, warning and extension replay
        await Replayer(workflows=[AllocationWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)
    if os.environ.get("BERTH_RECORD_HISTORIES"):
        (HISTORIES / "allocation_lease-expired.json").write_text(histories[0].to_json())


async def test_an_extension_moves_the_end_up_to_the_pools_max_lease(temporal_client, sessions, tmp_path: Path) -> None:
    fleet = lab_fleet({"n1": {"gpus": 2}, "n2": {"gpus": 2}}, slices={"maxLease": "1h"})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        too_long = await lab.allocate("too-long", gpus=2, lease=Lease(duration_seconds=7200), lease_seconds=7200)
        refused = await lab.wait_for_state(too_long, "failed")
        assert (
            refused.failure_reason
            == "no_region: 0/1 regions can serve 2 GPU slices: 1 grants shorter leases than asked"
        )

        handle = await lab.allocate("leased", gpus=2, lease=Lease(duration_seconds=600), lease_seconds=600)
        active = await lab.wait_for_state(handle, "active")
        assert active.ends_at is not None
        extended = await allocation_client.extend(temporal_client, "leased", ExtendRequest(seconds=1200))
        assert extended.ends_at == active.ends_at + timedelta(seconds=1200)
        assert (await handle.describe()).typed_search_attributes.get(ENDS_AT) == extended.ends_at
        with pytest.raises(allocation_client.Rejected, match="the pool grants leases of at most 1h0m0s"):
            await allocation_client.extend(temporal_client, "leased", ExtendRequest(seconds=3600))
        with pytest.raises(allocation_client.Rejected, match="is not later than the current end"):
            await allocation_client.extend(temporal_client, "leased", ExtendRequest(ends_at=active.ends_at))

        unbounded = await lab.allocate("no-end-asked", gpus=2)  # the pool's maxLease is its end
        given = await lab.wait_for_state(unbounded, "active")
        assert given.ends_at is not None
        steps = {step: reason for step, _state, _node, reason in await lab.events("leased")}
        assert steps["extended"] == f"ends at {extended.ends_at.isoformat()}"
        for allocation_id, running in (("leased", handle), ("no-end-asked", unbounded)):
            await allocation_client.release(temporal_client, allocation_id)
            assert (await running.result()).state == "released"


async def test_an_allocation_without_an_end_cannot_be_extended(temporal_client, sessions, tmp_path: Path) -> None:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"n1": {"gpus": 2}})) as lab:
        handle = await lab.allocate("endless", gpus=2)
        active = await lab.wait_for_state(handle, "active")
        assert active.ends_at is None
        with pytest.raises(allocation_client.Rejected, match="it has no end to extend"):
            await allocation_client.extend(temporal_client, "endless", ExtendRequest(seconds=60))
        await allocation_client.release(temporal_client, "endless")
        assert (await handle.result()).state == "released"
