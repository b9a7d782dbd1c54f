"""Waiting for capacity: requests that may wait are queued instead of failing, and the admission pass
that runs when capacity frees places the right one next, against real PostgreSQL and Temporal."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from fleet.loader import parse_fleet
from store import queue
from store.apply import apply_fleet
from store.models import AllocationRow
from tests.workflows.lab import Lab, lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import QueueWait
from workflows.queue_walk.client import ask_for_admission_pass
from workflows.queue_walk.workflow import QueueWalkWorkflow
from workflows.search_attributes import STATE

WAIT = QueueWait(timeout_seconds=600)


async def _entries(lab: Lab) -> dict[str, queue.QueueEntry]:
    async with lab.sessions() as session:
        return {e.allocation_id: e for e in await queue.entries(session)}


async def _release(lab: Lab, allocation_id: str) -> None:
    await allocation_client.release(lab.starter, allocation_id)
    assert (await allocation_client.handle(lab.starter, allocation_id).result()).state == "released"


async def _hold(lab: Lab, allocation_id: str, gpus: int, **request: object) -> None:
    """An allocation that takes capacity, active before the test goes on."""
    await lab.wait_for_state(await lab.allocate(allocation_id, gpus=gpus, **request), "active")  # type: ignore[arg-type]


def _namer() -> Callable[[str], str]:
    """Allocation ids unique to one test: the Temporal server outlives it, and a released id is not reused."""
    tag = uuid.uuid4().hex[:6]
    return lambda name: f"{name}-{tag}"


async def test_a_request_that_may_wait_is_queued_then_placed_when_capacity_frees(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"only": {"gpus": 4}})
    ) as lab:
        await _hold(lab, n("holder"), gpus=4)
        waiting = await lab.allocate(n("waiter"), gpus=2, queue=WAIT)
        status = await lab.wait_for_state(waiting, "queued")
        assert status.region == "lab" and status.bundles == [] and status.node is None
        assert (await waiting.describe()).typed_search_attributes.get(STATE) == "queued"
        entry = (await _entries(lab))[n("waiter")]
        assert entry.code == "insufficient_capacity" and "lab" in (entry.reason or "")
        assert await lab.active_claims() == {n("holder"): ["only/0", "only/1", "only/2", "only/3"]}  # it holds nothing

        await _release(lab, n("holder"))
        status = await lab.wait_for_state(waiting, "active")
        assert status.node == "only"
        assert await _entries(lab) == {}
        steps = [(step, state) for step, state, _node, _reason in await lab.events(n("waiter"))]
        assert steps[:4] == [
            ("select_region", "placing"),
            ("enter_queue", "queued"),
            ("woken", "placing"),
            ("find_candidates", "placing"),
        ]
        await _release(lab, n("waiter"))


async def test_a_request_that_does_not_ask_to_wait_still_fails_at_once(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"only": {"gpus": 4}})
    ) as lab:
        await _hold(lab, n("holder"), gpus=4)
        refused = await lab.allocate(n("impatient"), gpus=2)
        with pytest.raises(WorkflowFailureError):
            await refused.result()
        _step, state, _node, reason = (await lab.events(n("impatient")))[-1]
        assert state == "failed" and (reason or "").startswith("insufficient_capacity: lab: ")
        assert await _entries(lab) == {}
        await _release(lab, n("holder"))


async def test_the_queue_timeout_fails_it_with_the_last_reason_and_leaves_nothing(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"only": {"gpus": 4}})
    ) as lab:
        await _hold(lab, n("holder"), gpus=4)
        waiting = await lab.allocate(n("short"), gpus=2, queue=QueueWait(timeout_seconds=2))
        with pytest.raises(WorkflowFailureError) as failure:
            await waiting.result()
        assert getattr(failure.value.cause, "type", None) == "QueueTimeout"
        events = await lab.events(n("short"))
        assert [(step, state) for step, state, _node, _reason in events[-2:]] == [
            ("queue_timeout", "queued"),
            ("failed", "failed"),
        ]
        assert (events[-1][3] or "").startswith("queue_timeout: not placed within 2s; last: lab: ")
        assert await _entries(lab) == {}
        await _release(lab, n("holder"))


async def test_cancel_while_queued_compensates_nothing_and_leaves_the_queue(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"only": {"gpus": 4}})
    ) as lab:
        await _hold(lab, n("holder"), gpus=4)
        waiting = await lab.allocate(n("changed-mind"), gpus=2, queue=WAIT)
        await lab.wait_for_state(waiting, "queued")
        await waiting.cancel()
        with pytest.raises(WorkflowFailureError):
            await waiting.result()
        assert (await lab.events(n("changed-mind")))[-1][:2] == ("cancelled", "cancelled")
        assert await _entries(lab) == {}
        assert [p.name for p in lab.vm_records()] == [f"{n('holder')}.json"]  # only the holder ever had a VM
        await _release(lab, n("holder"))


async def test_a_higher_priority_request_that_came_later_is_placed_first(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, lab_fleet({"only": {"gpus": 4}})
    ) as lab:
        await _hold(lab, n("holder"), gpus=4)
        low = await lab.allocate(n("low"), gpus=4, queue=WAIT)
        await lab.wait_for_state(low, "queued")
        high = await lab.allocate(n("high"), gpus=4, queue=QueueWait(timeout_seconds=600, priority=100))
        await lab.wait_for_state(high, "queued")

        await _release(lab, n("holder"))
        await lab.wait_for_state(high, "active")
        assert (await allocation_client.status(lab.starter, n("low"))).state == "queued"
        await _release(lab, n("high"))
        await lab.wait_for_state(low, "active")  # its turn came with the next release
        await _release(lab, n("low"))


@pytest.mark.parametrize("fair", [False, True])
async def test_with_fair_sharing_the_tenant_with_the_smaller_share_goes_first_and_without_it_arrival_decides(
    temporal_client, sessions, tmp_path: Path, fair: bool
) -> None:
    """Two tenants with no quota of their own borrow their cohort's 4 GPUs. When 2 come back, Kueue without fair
    sharing admits the earlier request (both would borrow, equal priority); with fair sharing, the tenant whose share
    would be smaller with its request admitted (small-user: 2/4, against big-user's 4/4)."""
    n = _namer()
    tenants = {"big-user": {"gpuQuota": 0, "cohort": "lab"}, "small-user": {"gpuQuota": 0, "cohort": "lab"}}
    lab_cohort = {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "Cohort",
        "metadata": {"name": "lab"},
        "spec": {"gpuQuota": 4, "fairSharing": {"enabled": fair}},
    }
    fleet = lab_fleet({"one": {"gpus": 2}, "two": {"gpus": 2}}, tenants=tenants, extra=[lab_cohort])
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        holding = await lab.allocate(n("big-holds"), gpus=2, tenant="big-user")
        blocking = await lab.allocate(n("small-holds"), gpus=2, tenant="small-user")
        await lab.wait_for_state(holding, "active")
        await lab.wait_for_state(blocking, "active")
        first = await lab.allocate(n("big-asks-first"), gpus=2, tenant="big-user", queue=WAIT)
        await lab.wait_for_state(first, "queued")
        second = await lab.allocate(n("small-asks-later"), gpus=2, tenant="small-user", queue=WAIT)
        await lab.wait_for_state(second, "queued")

        await _release(lab, n("small-holds"))  # small-user then holds nothing, big-user half the cohort
        (admitted, admitted_id), (waiting, waiting_id) = sorted(
            [(first, n("big-asks-first")), (second, n("small-asks-later"))], key=lambda pair: (pair[0] is first) == fair
        )
        await lab.wait_for_state(admitted, "active")
        assert (await allocation_client.status(lab.starter, waiting_id)).state == "queued"
        await _release(lab, admitted_id)
        await lab.wait_for_state(waiting, "active")
        await _release(lab, waiting_id)
        await _release(lab, n("big-holds"))


@pytest.mark.parametrize("strategy", ["BestEffortFIFO", "StrictFIFO"])
async def test_the_head_keeps_its_node_and_smaller_requests_pass_it_only_under_best_effort(
    temporal_client, sessions, tmp_path: Path, strategy: str
) -> None:
    n = _namer()
    # `wide` (4 GPUs) is the only node that could ever hold the 4-GPU head; `narrow` (2) cannot.
    fleet = lab_fleet({"narrow": {"gpus": 2}, "wide": {"gpus": 4}}, region={"queueingStrategy": strategy})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        await _hold(lab, n("holder"), gpus=2, nodes=frozenset({"wide"}))
        head = await lab.allocate(n("head"), gpus=4, queue=WAIT)
        await lab.wait_for_state(head, "queued")
        entry = (await _entries(lab))[n("head")]
        assert entry.reserved_node == ("wide" if strategy == "BestEffortFIFO" else None)

        small = await lab.allocate(n("small"), gpus=1, queue=WAIT)
        if strategy == "BestEffortFIFO":
            status = await lab.wait_for_state(small, "active")
            assert status.node == "narrow"  # backfilled outside the head's reservation, though `wide` had room
        else:
            await lab.wait_for_state(small, "queued")
            assert (await _entries(lab))[n("small")].code == "queued_behind"

        await _release(lab, n("holder"))
        assert (await lab.wait_for_state(head, "active")).node == "wide"
        assert (await lab.wait_for_state(small, "active")).node == "narrow"
        await _release(lab, n("head"))
        await _release(lab, n("small"))


async def test_strict_fifo_a_head_held_back_by_its_quota_blocks_its_own_tenant_only(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """Kueue's StrictFIFO blocks a queue behind its head whatever holds the head back: acme's later request that
    would fit acme's quota waits behind acme's head; another tenant's request is not blocked by it."""
    n = _namer()
    tenants = {"acme": {"gpuQuota": 4}, "globex": {"gpuQuota": 8}}
    fleet = lab_fleet(
        {"one": {"gpus": 4}, "two": {"gpus": 4}}, tenants=tenants, region={"queueingStrategy": "StrictFIFO"}
    )
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        await _hold(lab, n("holder"), gpus=3)
        big = await lab.allocate(n("big"), gpus=2, queue=WAIT)  # 3 + 2 > 4: its quota holds it back
        await lab.wait_for_state(big, "queued")
        small = await lab.allocate(n("small"), gpus=1, queue=WAIT)  # 3 + 1 <= 4, but it does not pass its head
        await lab.wait_for_state(small, "queued")
        other = await lab.allocate(n("other"), gpus=1, tenant="globex", queue=WAIT)
        await lab.wait_for_state(other, "active")  # within its quota: it goes before acme's requests
        entries = await _entries(lab)
        assert entries[n("big")].code == "quota_exceeded"
        # It entered behind its tenant's head (no pass runs for a request that enters behind others; the next one
        # says the same in its own words).
        assert entries[n("small")].code == "queued_behind" and "behind" in (entries[n("small")].reason or "")
        assert (await allocation_client.status(lab.starter, n("small"))).state == "queued"

        await _release(lab, n("holder"))
        await lab.wait_for_state(big, "active")
        await lab.wait_for_state(small, "active")
        for name in ("big", "small", "other"):
            await _release(lab, n(name))


async def test_a_request_over_its_tenants_quota_waits_for_the_tenants_own_gpus(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    fleet = lab_fleet({"one": {"gpus": 4}, "two": {"gpus": 4}}, quota=4)
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        holder = await lab.allocate(n("holder"), gpus=4)
        await lab.wait_for_state(holder, "active")
        waiting = await lab.allocate(n("over-quota"), gpus=2, queue=WAIT)
        await lab.wait_for_state(waiting, "queued")
        entry = (await _entries(lab))[n("over-quota")]
        assert entry.code == "quota_exceeded" and "quota 4" in (entry.reason or "")

        await _release(lab, n("holder"))
        await lab.wait_for_state(waiting, "active")
        await _release(lab, n("over-quota"))


async def test_a_request_over_its_products_quota_waits_for_that_products_gpus(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    tenants = {"acme": {"gpuQuota": 64, "quotas": [{"product": "H200", "region": "lab", "nominal": 3}]}}
    fleet = lab_fleet({"one": {"gpus": 4}, "two": {"gpus": 4}}, tenants=tenants)
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        await _hold(lab, n("holder"), gpus=2)
        waiting = await lab.allocate(n("over-h200"), gpus=2, queue=WAIT)
        await lab.wait_for_state(waiting, "queued")  # the fleet has room: the H200 quota in lab has not
        entry = (await _entries(lab))[n("over-h200")]
        assert entry.code == "quota_exceeded"
        assert "would exceed its H200 in lab quota: 2 held + 2 requested > quota 3" in (entry.reason or "")

        await _release(lab, n("holder"))
        await lab.wait_for_state(waiting, "active")
        await _release(lab, n("over-h200"))


async def test_an_admission_pass_asked_for_from_outside_places_what_now_fits_and_its_history_replays(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """`ask_for_admission_pass` (what the API and `berth apply` call after a change): here the change is a quota raised by an
    apply written straight to PostgreSQL, which nothing else announces (no release comes; the tests run no
    reconciler schedule)."""
    n = _namer()
    fleet = lab_fleet({"one": {"gpus": 4}}, quota=2)
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        await _hold(lab, n("holder"), gpus=2)
        waiting = await lab.allocate(n("over-quota"), gpus=2, queue=WAIT)
        await lab.wait_for_state(waiting, "queued")
        async with lab.sessions.begin() as session:
            await apply_fleet(session, parse_fleet([("fleet.yaml", lab_fleet({"one": {"gpus": 4}}, quota=4))]))

        await ask_for_admission_pass(temporal_client, lab.queues, "quota raised")
        await lab.wait_for_state(waiting, "active")
        passes = temporal_client.get_workflow_handle(f"queue-walk/{lab.queues.control}")
        assert await passes.result() >= 1
        history = await passes.fetch_history()
        await _release(lab, n("holder"))
        await _release(lab, n("over-quota"))
    await Replayer(workflows=[QueueWalkWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)


async def test_a_tenant_borrows_its_cohorts_unused_quota_is_marked_so_and_waits_when_the_cohort_has_none_left(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    tenants = {
        "small-team": {"gpuQuota": 2, "cohort": "research"},
        "big-team": {"gpuQuota": 4, "cohort": "research", "lendingLimit": 2},
    }
    fleet = lab_fleet({"one": {"gpus": 4}, "two": {"gpus": 4}}, tenants=tenants)
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        borrower = await lab.allocate(n("borrower"), gpus=4, tenant="small-team")  # 2 of its own, 2 lent
        await lab.wait_for_state(borrower, "active")
        async with lab.sessions() as session:
            row = await session.get(AllocationRow, n("borrower"))
            assert row is not None and row.borrowed_gpus == 2

        more = await lab.allocate(n("more"), gpus=2, tenant="small-team", queue=WAIT)
        await lab.wait_for_state(more, "queued")  # big-team lends at most 2: none left
        entry = (await _entries(lab))[n("more")]
        assert entry.code == "quota_exceeded"
        assert "cohort research has 0 GPUs left to lend (2 needed)" in (entry.reason or "")

        await _release(lab, n("borrower"))
        await lab.wait_for_state(more, "active")
        async with lab.sessions() as session:
            row = await session.get(AllocationRow, n("more"))
            assert row is not None and row.borrowed_gpus == 0  # within its own quota now
        await _release(lab, n("more"))


async def test_a_waiting_request_whose_every_candidate_fails_goes_back_to_its_queue_instead_of_failing(
    temporal_client, sessions, tmp_path: Path
) -> None:
    n = _namer()
    # `broken` fails every VM create; `sound` is taken. A request that may wait is tried on `broken`, and with no
    # candidate left it waits again (the reason says why) until `sound` frees.
    fleet = lab_fleet({"broken": {"gpus": 4, "simulation": {"failCreate": True}}, "sound": {"gpus": 4}})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        await _hold(lab, n("holder"), gpus=4, nodes=frozenset({"sound"}))
        waiting = await lab.allocate(n("persistent"), gpus=4, queue=WAIT)
        status = await lab.wait_for_state(waiting, "queued")
        # It may be woken onto `broken` again (the node is free) before the breaker cools it off, each round after
        # a longer pause: every attempt so far is one on `broken`, failed.
        assert status.attempts and {(a.node, a.outcome) for a in status.attempts} == {("broken", "failed")}
        requeued = [r for step, _s, _n, r in await lab.events(n("persistent")) if step == "enter_queue" and r]
        assert any(r.startswith("sku_unavailable: ") and "could not be placed in lab (broken: " in r for r in requeued)

        await _release(lab, n("holder"))
        status = await lab.wait_for_state(waiting, "active", timeout=60)
        assert status.node == "sound"
        await _release(lab, n("persistent"))
