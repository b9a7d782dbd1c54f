"""The allocation saga's main road: placed, active, released, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.search_attributes import STATE, TENANT


@pytest.fixture
def hosts() -> dict:
    # `small` has 2 GPUs: best fit puts a 2-GPU request there and keeps `big` whole.
    return {"small": {"gpus": 2}, "big": {"gpus": 4}}


async def test_allocation_becomes_active_then_release_returns_everything(
    temporal_env, temporal_client, sessions, tmp_path: Path, hosts
) -> None:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts)) as lab:
        handle = await lab.allocate("happy-1", gpus=2)
        status = await lab.wait_for_state(handle, "active")
        assert (status.region, status.pool, status.node) == ("lab", "lab-1/slices", "small")
        assert [b.slot_index for b in status.bundles] == [0, 1]
        assert [(a.node, a.outcome) for a in status.attempts] == [("small", "succeeded")]
        assert await lab.active_claims() == {"happy-1": ["small/0", "small/1"]}
        assert (await lab.slot_states())["small/0"] == "reserved"
        assert [p.name for p in lab.vm_records()] == ["happy-1.json"]
        assert lab.lease_files() == []  # the VM holds the slots now; the lease did its job

        description = await handle.describe()
        assert description.typed_search_attributes.get(STATE) == "active"
        assert description.typed_search_attributes.get(TENANT) == "acme"

        await allocation_client.release(temporal_client, "happy-1")
        result = await handle.result()
        assert result.state == "released"
        assert await lab.active_claims() == {}
        assert set((await lab.slot_states()).values()) == {"available"}
        assert lab.vm_records() == [] and lab.lease_files() == []
        steps = [(step, state) for step, state, _node, _reason in await lab.events("happy-1")]
        assert steps == [
            ("select_region", "placing"),
            ("find_candidates", "placing"),
            ("plan_bundles", "planning"),
            ("record_claims", "claiming"),
            ("create_vm", "provisioning"),
            ("wait_ready", "waiting_ready"),
            ("ready", "active"),
            ("release", "releasing"),
            ("released", "released"),
        ]
        assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED


async def test_release_is_refused_while_placing_and_retry_while_active(
    temporal_client, sessions, tmp_path: Path, hosts
) -> None:
    slow = {"small": {"gpus": 2, "simulation": {"bootSeconds": 3600}}, "big": {"gpus": 4}}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(slow)) as lab:
        handle = await lab.allocate("early", gpus=2)
        await lab.wait_for_state(handle, "waiting_ready")
        with pytest.raises(allocation_client.Rejected, match="only an active allocation can be released"):
            await allocation_client.release(temporal_client, "early")
        await handle.cancel()
        other = await lab.allocate("later", gpus=4)
        await lab.wait_for_state(other, "active")
        with pytest.raises(allocation_client.Rejected, match="allocation is active; only an allocation being placed"):
            await allocation_client.retry(temporal_client, "later", [])
        await allocation_client.release(temporal_client, "later")
        assert (await other.result()).state == "released"
