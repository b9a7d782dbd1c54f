"""Preemption against real PostgreSQL and Temporal: a queued request of a higher class displaces a
preemptible allocation; the victim is told (`preempting`, with the preemptor's priority and never its tenant), keeps
its grace period, then releases as a release does (`preempted`); the freed node is held for the preemptor, which is
placed there, and none of a stream of requests that came meanwhile takes any of it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.actions import run_histories
from store import queue
from store.models import AllocationRow
from tests.ledger import billed
from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import QueueWait
from workflows.allocation.workflow import AllocationWorkflow
from workflows.search_attributes import STATE

HISTORIES = Path(__file__).parent / "histories"
CLASSES = [
    {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "spot"},
        "spec": {"value": 0, "preemptible": True, "gracePeriod": "5s"},
    },
    {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "urgent"},
        "spec": {"value": 100},
    },
]


async def test_a_preemptible_allocation_is_told_keeps_its_grace_then_leaves_its_node_to_the_preemptor(
    temporal_client, sessions, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    spot, urgent, other = f"spot-{tag}", f"urgent-{tag}", f"other-{tag}"
    fleet = lab_fleet({"only": {"gpus": 4}}, extra=CLASSES)
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        victim = await lab.allocate(spot, gpus=4, request_body={"priority_class": "spot"})
        await lab.wait_for_state(victim, "active")

        waiting = QueueWait(timeout_seconds=600, priority=100, priority_class="urgent")
        preemptor = await lab.allocate(urgent, gpus=4, queue=waiting)
        told = await lab.wait_for_state(victim, "preempting")
        assert told.step == "preempt_notice"
        # The notice the owner reads: the preemptor's priority and class, the rule, the grace; never its tenant.
        notice = next(reason for step, _s, _n, reason in await lab.events(spot) if step == "preempt_notice")
        assert notice == (
            "preempted for a request of priority 100 (class urgent) (of a preemptible PriorityClass); released after 5s"
        )
        assert "acme" not in notice
        async with sessions() as session:  # what `berth queue` shows of it
            entry = await queue.entry(session, urgent)
        assert entry is not None and (entry.code, entry.nominated_node, entry.victims) == ("preempting", "only", [spot])
        assert entry.reason == f"preempting 1 allocation(s) on node only: {spot}: of a preemptible PriorityClass"
        assert (await victim.describe()).typed_search_attributes.get(STATE) == "preempting"

        # A stream of requests comes while the victim leaves, of every size, placed at once or queued at a lower
        # priority: the node is held for the preemptor, so none of them takes any of its GPUs.
        latecomers = [await lab.allocate(f"{other}-{gpus}", gpus=gpus) for gpus in (1, 2, 4)]
        queued = [await lab.allocate(f"{other}-q{n}", gpus=1, queue=QueueWait(timeout_seconds=600)) for n in (1, 2)]
        for latecomer in latecomers:
            assert (await lab.wait_for_state(latecomer, "failed")).failure_reason is not None
        for waiter in queued:
            await lab.wait_for_state(waiter, "queued")

        assert (await victim.result()).state == "preempted"
        placed = await lab.wait_for_state(preemptor, "active")
        assert placed.node == "only"
        steps = [(step, state) for step, state, _node, _reason in await lab.events(spot)]
        assert steps[-4:] == [
            ("ready", "active"),
            ("preempt_notice", "preempting"),
            ("preempt", "releasing"),
            ("preempted", "preempted"),
        ]
        # The trail says who decided: the admission pass's preemption, not a person.
        assert await lab.actors(spot) == {"preempt_notice": "berth:preemption", "preempt": "berth:preemption"}
        assert await lab.double_claims() == 0
        assert await lab.active_claims() == {urgent: ["only/0", "only/1", "only/2", "only/3"]}
        async with sessions() as session:
            assert (await session.get(AllocationRow, spot)).state == "preempted"
        assert await billed(sessions, spot) == [(1, 4, "preempted")]
        assert await billed(sessions, urgent) == [(1, 4, None)]
        for n in (1, 2):
            assert (await allocation_client.status(temporal_client, f"{other}-q{n}")).state == "queued"
        await allocation_client.release(temporal_client, urgent)
        assert (await preemptor.result()).state == "released"
        for n, waiter in zip((1, 2), queued, strict=True):  # the preemptor gone, the queue's requests get the node
            await lab.wait_for_state(waiter, "active")
            await allocation_client.release(temporal_client, f"{other}-q{n}")
            assert (await waiter.result()).state == "released"
        histories = await run_histories(temporal_client, f"allocation/{spot}")
    assert len(histories) == 1  # placed and held until preempted, in one run
    for history in histories:
        await Replayer(workflows=[AllocationWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)
    if os.environ.get("BERTH_RECORD_HISTORIES"):
        (HISTORIES / "allocation_preempted.json").write_text(histories[0].to_json())
