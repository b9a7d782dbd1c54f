"""One allocation, one story: the run that places an allocation holds it, so the Temporal UI's page tells the whole
story, a release right after `active` is taken at once, and every filter on the Berth search attributes lists an
allocation once, also when a long hold hands over to a fresh run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.actions import run_histories
from contracts.allocation import Lease
from devstack.temporal import temporal_binary
from tests.workflows.lab import FAST, lab_fleet, running_lab
from workflows import search_attributes as sa
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import AllocationStatus, ExtendRequest
from workflows.allocation.workflow import AllocationWorkflow

HISTORIES = Path(__file__).parent / "histories"
CONTINUED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
UPDATE_ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED


def node_steps(history: WorkflowHistory) -> list[str]:
    """The node steps as the UI's timeline names them (each activity's summary)."""
    return [
        e.user_metadata.summary.data.decode().strip('"')
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def until_active(client: Client, allocation_id: str, every: float = 0.01) -> AllocationStatus:
    """Ask the workflow, as the API does, until it says `active`: the caller acts at once after."""
    for _ in range(3000):
        status = await allocation_client.status(client, allocation_id)
        if status.state == "active":
            return status
        await asyncio.sleep(every)
    raise AssertionError(f"{allocation_id} never became active: {status}")


async def current_details(client: Client, allocation_id: str) -> str:
    """The markdown the UI shows under User Metadata, Current Details, for the workflow id's current run."""
    handle = client.get_workflow_handle(allocation_client.workflow_id(allocation_id))
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def listed(client: Client, query: str, ids: set[str]) -> Counter[str]:
    """How many rows each of `ids` has in the UI's list for `query` (the rows of other tests' workflows ignored)."""
    rows: Counter[str] = Counter()
    async for execution in client.list_workflows(query):
        if execution.id in ids:
            rows[execution.id] += 1
    return rows


async def listed_once(client: Client, query: str, ids: set[str]) -> Counter[str]:
    """The list once visibility has caught up with every id (it lags the workflows by a moment)."""
    for _ in range(100):
        rows = await listed(client, query, ids)
        if set(rows) == ids and set(rows.values()) == {1}:
            return rows
        await asyncio.sleep(0.1)
    return rows


async def test_twenty_allocations_released_at_once_after_active_each_stay_one_run(
    temporal_client: Client, sessions, tmp_path: Path
) -> None:
    """Before, every allocation continued as new at `active`, and Temporal kept the hold run from answering until a
    second after the first run started: about half of them read `provisioning` for that second, and a release
    sent then waited for it. Now the release goes to the run that placed it, within the poll that saw `active`."""
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"n": {"gpus": 2}})) as lab:
        tag = uuid.uuid4().hex[:6]  # ids unique to this test: the Temporal server is shared with other tests
        ids = [f"one-story-{tag}-{n}" for n in range(20)]
        for allocation_id in ids:
            handle = await lab.allocate(allocation_id, gpus=1)
            await until_active(temporal_client, allocation_id)
            released = await allocation_client.release(temporal_client, allocation_id)
            assert released.state == "active"  # taken in the state it was seen in: nothing in between
            assert (await handle.result()).state == "released"
        histories = {name: await run_histories(temporal_client, f"allocation/{name}") for name in ids}

    for allocation_id, runs in histories.items():
        assert len(runs) == 1, f"{allocation_id} took {len(runs)} runs"
        (run,) = runs
        kinds = [e.event_type for e in run.events]
        assert CONTINUED not in kinds
        assert kinds.count(UPDATE_ACCEPTED) == 1  # the release, taken by the run that placed it
        assert node_steps(run) == ["plan_bundles on n", "create_vm + wait_ready on n", "destroy_vm on n"]


async def test_a_hand_over_keeps_one_row_per_allocation_and_says_what_came_before(
    temporal_client: Client, sessions, tmp_path: Path
) -> None:
    hosts = {"left": {"gpus": 2}, "right": {"gpus": 2}}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts)) as lab:
        handles = {name: await lab.allocate(name, gpus=2) for name in ("once-stays", "once-moves")}
        for name in handles:
            await until_active(temporal_client, name, every=0.1)
        first_run = handles["once-moves"].result_run_id
        assert first_run is not None
        # An operator asks, as before an upgrade that retires this revision (docs/design.md): the Temporal CLI's batch
        # signal to the runs a visibility query finds. The hold goes on in a fresh run.
        current = temporal_client.get_workflow_handle(handles["once-moves"].id)
        asked = await asyncio.to_thread(
            subprocess.run,
            [
                temporal_binary(),
                "workflow",
                "signal",
                "--address",
                temporal_client.service_client.config.target_host,
                "--namespace",
                temporal_client.namespace,
                "--name",
                "hand_over",
                "--input",
                '{"reason": "upgrade"}',
                "--yes",
                "--query",
                f"WorkflowType = 'Allocation' AND ExecutionStatus = 'Running' AND WorkflowId = '{current.id}'",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert asked.returncode == 0, asked.stderr
        await _until_runs(temporal_client, "once-moves", 2)
        status = await until_active(temporal_client, "once-moves")
        ids = {handle.id for handle in handles.values()}

        # Every filter an operator uses lists each allocation once: the run left behind keeps no Berth attribute.
        for query in ('BerthState="active"', 'BerthTenant="acme"', 'BerthRegion="lab"', 'BerthKind="allocation"'):
            rows = await listed_once(temporal_client, query, ids)
            assert rows == Counter(dict.fromkeys(ids, 1)), (query, rows)
        rows = await listed_once(temporal_client, f'BerthNode="{status.node}"', {handles["once-moves"].id})
        assert rows == Counter({handles["once-moves"].id: 1})
        left_behind = await temporal_client.get_workflow_handle(current.id, run_id=first_run).describe()
        assert [key.name for key in sa.ALL if left_behind.typed_search_attributes.get(key) is not None] == []
        now = (await current.describe()).typed_search_attributes
        assert (now.get(sa.STATE), now.get(sa.NODE), now.get(sa.TENANT)) == ("active", status.node, "acme")

        # The current run's page says where the story began and carries what came before.
        details = await current_details(temporal_client, "once-moves")
        assert f"continues the hold of run `{first_run}` (asked: upgrade)" in details, details
        assert f"node: {status.node}" in details
        assert f"bundles: {status.node}/0 (GPU 0000:10:00.0), {status.node}/1 (GPU 0000:11:00.0)" in details
        assert f"| 1 | {status.node} | succeeded |" in details
        steps = [(step, state) for step, state, _node, _reason in await lab.events("once-moves")]
        assert steps[-2:] == [("ready", "active"), ("hand_over", "active")]

        # Released, by the run that holds it now.
        for name, handle in handles.items():
            await allocation_client.release(temporal_client, name)
            assert (await handle.result()).state == "released"
        placed, held = await run_histories(temporal_client, current.id)
    assert node_steps(placed) == [f"{step} on {status.node}" for step in ("plan_bundles", "create_vm + wait_ready")]
    assert node_steps(held) == [f"destroy_vm on {status.node}"]
    await _record(placed, held)


async def test_a_hold_whose_history_grows_long_hands_over_by_itself(
    temporal_client: Client, sessions, tmp_path: Path
) -> None:
    timing = FAST.model_copy(update={"hold_history_events": 50})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"n": {"gpus": 2}})) as lab:
        handle = await lab.allocate("grows", gpus=2, timing=timing, lease=Lease(duration_seconds=3600))
        status = await until_active(temporal_client, "grows", every=0.1)
        assert status.ends_at is not None
        extensions = 0
        while len(await run_histories(temporal_client, handle.id)) == 1:
            extensions += 1
            assert extensions <= 10, "the hold never handed over"
            await allocation_client.extend(temporal_client, "grows", ExtendRequest(seconds=60))
            await asyncio.sleep(0.2)
        placed, held = await run_histories(temporal_client, handle.id)
        assert len(placed.events) >= 50
        moved = await until_active(temporal_client, "grows")
        assert moved.ends_at == status.ends_at + timedelta(seconds=60 * extensions)  # the end went with it
        assert "its history reached 50 events" in await current_details(temporal_client, "grows")
        await allocation_client.release(temporal_client, "grows")
        assert (await handle.result()).state == "released"
        assert await lab.active_claims() == {}


async def _until_runs(client: Client, allocation_id: str, runs: int) -> None:
    for _ in range(200):
        if len(await run_histories(client, f"allocation/{allocation_id}")) >= runs:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{allocation_id} did not reach {runs} runs")


async def _record(*histories: WorkflowHistory) -> None:
    """The hand-over's two runs replay on this code; BERTH_RECORD_HISTORIES=1 keeps them for test_replay.py."""
    for number, history in enumerate(histories, start=1):
        await Replayer(workflows=[AllocationWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)
        if os.environ.get("BERTH_RECORD_HISTORIES"):
            (HISTORIES / f"allocation_handed-over_{number}.json").write_text(history.to_json())
