"""Retiring a revision (docs/design.md, "Upgrading the allocation workflow"): the code runs the current revision and
the one before it, refuses an older run before it takes a step, and a hand-over moves a held allocation onto the
current revision; `python -m workflows.allocation.retire` lists what stands in the way of a deploy and sends the
hand-overs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.actions import run_histories
from contracts.placement import PlacementRequest
from tests.workflows.allocation.test_one_story import until_active
from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation import retire
from workflows.allocation.messages import AllocationInput, AllocationStatus, Deadlines, HandOverRequest, Held
from workflows.allocation.revisions import OLDEST, REVISION, retired

TASK_FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED


def _input(revision: int, *, begun_as: str = "request") -> AllocationInput:
    held = None
    if begun_as != "request":
        status = AllocationStatus(allocation_id="r", tenant="acme", state="active", step="ready")
        previous = "an-earlier-run" if begun_as == "hand-over" else None
        held = Held(status=status, deadlines=Deadlines(), active_since=datetime.now(UTC), previous_run_id=previous)
    request = PlacementRequest(gpu_count=1, tenant="acme")
    return AllocationInput(allocation_id="r", tenant="acme", request=request, revision=revision, held=held)


@pytest.mark.parametrize(
    ("revision", "begun_as", "runs_here"),
    [
        (REVISION, "request", True),
        (REVISION, "hand-over", True),
        (OLDEST, "request", True),
        (5, "request", False),  # its history holds revision 5's placement (the `placing` upsert of its own)
        (4, "request", False),
        (5, "hand-over", True),  # a hold begun by a hand-over: the hold's commands only, unchanged since 4
        (4, "hand-over", True),
        (3, "hold at active", False),  # revisions 2 and 3's hold ignored `hand_over`: its history may hold one
        (3, "request", False),
        (0, "request", False),
    ],
)
def test_the_code_runs_the_current_and_previous_revisions_and_holds_handed_over_since_4(
    revision: int, begun_as: str, runs_here: bool
) -> None:
    input = _input(revision, begun_as=begun_as)
    assert (retired(input) is None) == runs_here
    assert retire.begun_as(input) == begun_as


@pytest.mark.parametrize(
    ("revision", "begun_as", "state", "to_do"),
    [
        (OLDEST, "request", "placing", ""),
        (5, "request", "active", "hand over"),
        (5, "request", "queued", "hand over (it does so once active)"),
        (4, "hand-over", "active", ""),
        (4, "hand-over", "releasing", "wait: it is releasing by revision 4's steps"),
        (
            3,
            "hold at active",
            "active",
            "end: a hold of revisions 2 and 3 ignores hand_over; released, cancelled or at its end",
        ),
    ],
)
def test_what_stands_in_the_way_of_a_deploy(revision: int, begun_as: str, state: str, to_do: str) -> None:
    assert retire.to_do(_input(revision, begun_as=begun_as), state) == to_do


async def test_an_older_run_waits_untouched_and_a_hand_over_moves_a_hold_to_the_current_revision(
    temporal_client: Client, sessions, tmp_path: Path
) -> None:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"n": {"gpus": 4}})) as lab:
        # Revision 6 runs here; a run of revision 5 (as a worker of an older release would have left it) does not.
        previous = await allocation_client.start_allocation(lab.starter, lab.input_for("held-6"), revision=OLDEST)
        await until_active(temporal_client, "held-6")
        older = await allocation_client.start_allocation(lab.starter, lab.input_for("placed-5"), revision=5)
        failures = await _task_failures(temporal_client, older.id)
        assert "revision 5 is retired" in failures[0]
        assert [e.event_type for e in (await older.fetch_history()).events].count(
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ) == 0  # no step taken: its history is as it was
        assert await lab.active_claims() == {"held-6": ["n/0", "n/1"]}

        runs = {run.workflow_id: run for run in await retire.open_runs(temporal_client, lab.queues.control)}
        assert (runs[previous.id].revision, runs[previous.id].to_do) == (OLDEST, "")
        assert (runs[older.id].revision, runs[older.id].to_do) == (5, "hand over (it does so once active)")
        assert "1 stand in the way" in retire.report(list(runs.values()))

        # The hold of revision 6 goes on in a fresh run of the current revision.
        await temporal_client.get_workflow_handle(previous.id).signal("hand_over", HandOverRequest(reason="upgrade"))
        runs = await _until_open(temporal_client, lab.queues.control, previous.id, REVISION)
        assert runs[previous.id].begun_as == "hand-over"
        assert len(await run_histories(temporal_client, previous.id)) == 2
        assert await retire.hand_over(temporal_client, list(runs.values()), "upgrade") == 1  # the revision 5 run

        await older.terminate("the test is done")
        await allocation_client.release(temporal_client, "held-6")
        assert (await previous.result()).state == "released"
        assert await lab.active_claims() == {}


async def _until_open(client: Client, queue: str, workflow_id: str, revision: int) -> dict[str, retire.OpenRun]:
    """The open runs, once the workflow's open run is of `revision` (and its last one is no longer listed open)."""
    for _ in range(200):
        found = await retire.open_runs(client, queue)
        runs = {run.workflow_id: run for run in found}
        if len(runs) == len(found) and workflow_id in runs and runs[workflow_id].revision == revision:
            return runs
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow_id} has no open run of revision {revision}")


async def _task_failures(client: Client, workflow_id: str) -> list[str]:
    """The workflow task failures of the workflow's run, once it has one."""
    for _ in range(200):
        events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
        failures = [
            e.workflow_task_failed_event_attributes.failure.message for e in events if e.event_type == TASK_FAILED
        ]
        if failures:
            return failures
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow_id} never failed a workflow task")
