"""Temporal actions per workflow, counted from its history: what Temporal Cloud bills and rate-limits (500 actions/s
per namespace by default), so a cost every production user pays per allocation.

Counted, one each: the workflow start, every activity scheduled (a retry is another), every local activity (its
marker), every search-attribute upsert (the patch's `TemporalChangeVersion` upsert included), every signal and
update, every timer, every child workflow started. Patch markers are shown apart: they are history events, not in
the list above.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

KINDS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "start",
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity",
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "upsert",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signal",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "update",
    EventType.EVENT_TYPE_TIMER_STARTED: "timer",
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "child",
}
MARKERS = {"core_local_activity": "local_activity", "core_patch": "patch_marker"}
NOT_ACTIONS = ("patch_marker",)


@dataclass
class Actions:
    """Actions of one history, by kind, up to `active` (before the release or cancel) and in all."""

    to_active: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)

    @staticmethod
    def count(kinds: Counter[str]) -> int:
        return sum(n for kind, n in kinds.items() if kind not in NOT_ACTIONS)


async def run_histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Every run of the workflow, from its first: one for an allocation unless its hold handed over to a fresh run
    (its history grew long, or an operator asked)."""
    description = await client.get_workflow_handle(workflow_id).describe()
    run_id: str | None = description.raw_description.workflow_execution_info.first_run_id or description.run_id
    histories: list[WorkflowHistory] = []
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        continued = last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id if continued else None
    return histories


def count_actions(histories: list[WorkflowHistory]) -> Actions:
    """The actions of a workflow's runs together (a continue-as-new is the next run's start). `to_active` stops at
    the first update, signal or cancel request after the start: for an allocation held until released, that is the
    release (the happy path to `active` makes none)."""
    actions = Actions()
    holding = True
    for event in (event for history in histories for event in history.events):
        if event.event_type in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED,
        ):
            holding = False
        kind = KINDS.get(event.event_type)
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            kind = MARKERS.get(event.marker_recorded_event_attributes.marker_name, "marker")
        if kind is None:
            continue
        actions.total[kind] += 1
        if holding:
            actions.to_active[kind] += 1
    return actions


def describe(kinds: Counter[str]) -> str:
    """`11 (1 start, 4 upsert, ...)`, patch markers named apart."""
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    return f"{Actions.count(kinds)} ({parts})"
