"""Quota as Kueue decides it, against real PostgreSQL and Temporal: a cohort never uses more than its members own
whatever hardware is free, a lender gets its lent quota back by preemption (`reclaimWithinCohort`), and each
allocation records its own part of what its tenant borrows."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

from sqlalchemy import select
from temporalio.client import WorkflowFailureError

from store import queue
from store.models import AllocationRow
from tests.api.stack import running_stack
from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import QueueWait

BATCH = [
    {
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "batch"},
        "spec": {"value": 0, "gracePeriod": "1s"},
    },
]


async def test_each_allocation_records_its_own_part_of_what_its_tenant_borrows(
    temporal_client, sessions, tmp_path: Path
) -> None:
    tenants = {"small": {"gpuQuota": 3, "cohort": "research"}, "big": {"gpuQuota": 8, "cohort": "research"}}
    fleet = lab_fleet({"one": {"gpus": 4}, "two": {"gpus": 4}}, tenants=tenants)
    tag = uuid.uuid4().hex[:6]
    names = [f"part-{tag}-{n}" for n in range(5)]
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        for name in names:  # one at a time: the fourth and the fifth each borrow one GPU
            await lab.wait_for_state(await lab.allocate(name, gpus=1, tenant="small"), "active")
        async with sessions() as session:
            rows = dict((await session.execute(select(AllocationRow.id, AllocationRow.borrowed_gpus))).all())
        assert [rows[name] for name in names] == [0, 0, 0, 1, 1]
        for name in names:
            await allocation_client.release(temporal_client, name)


async def test_a_lender_reclaims_its_lent_quota_by_preemption_while_free_hardware_exists(
    temporal_client, sessions, tmp_path: Path
) -> None:
    tenants = {
        "lender": {"gpuQuota": 4, "cohort": "research", "preemption": {"reclaimWithinCohort": "Any"}},
        "borrower": {"gpuQuota": 0, "cohort": "research"},
    }
    fleet = lab_fleet({"one": {"gpus": 4}, "two": {"gpus": 4}, "three": {"gpus": 4}}, tenants=tenants, extra=BATCH)
    tag = uuid.uuid4().hex[:6]
    borrowed, reclaiming = f"borrowed-{tag}", f"reclaim-{tag}"
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        victim = await lab.allocate(borrowed, gpus=4, tenant="borrower", request_body={"priority_class": "batch"})
        await lab.wait_for_state(victim, "active")  # all of the lender's quota, lent

        # 8 GPUs are free, but the cohort owns 4 and uses 4: the lender's request, within its own quota, is not
        # placed on free hardware. It waits, and its queue reclaims the lent GPUs by preemption.
        assert await lab.available_slots() == 8
        waiting = await lab.allocate(reclaiming, gpus=2, tenant="lender", queue=QueueWait(timeout_seconds=600))
        assert (await asyncio.wait_for(victim.result(), 60)).state == "preempted"
        placed = await lab.wait_for_state(waiting, "active")
        assert placed.node is not None

        events = await lab.events(reclaiming)
        queued = next(reason for step, _state, _node, reason in events if step == "enter_queue")
        assert queued is not None and "but cohort research has lent it out: 4 GPUs borrowed by other members" in queued
        notice = next(reason for step, _s, _n, reason in await lab.events(borrowed) if step == "preempt_notice")
        assert notice is not None and (
            "(reclaimWithinCohort Any: its tenant borrows in cohort research (Kueue: InCohortReclamation))" in notice
        )
        claims = await lab.active_claims()
        assert sum(len(slots) for slots in claims.values()) == 2  # never more than the cohort's 4
        assert await lab.double_claims() == 0
        await allocation_client.release(temporal_client, reclaiming)


async def test_a_non_preemptible_class_is_admitted_within_nominal_quota_only_and_never_displaced(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """KAI-Scheduler's non-preemptible workloads, through the API: never on GPUs borrowed from the cohort (409 at
    once, the quota's message), and never a victim, even of its own tenant's higher priority under
    `withinTenant: LowerPriority`."""
    classes = [
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "PriorityClass",
            "metadata": {"name": "pinned"},
            "spec": {"value": 0, "nonPreemptible": True},
        },
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "PriorityClass",
            "metadata": {"name": "urgent"},
            "spec": {"value": 100},
        },
    ]
    tenants = {
        "acme": {"gpuQuota": 2, "cohort": "research", "preemption": {"withinTenant": "LowerPriority"}},
        "globex": {"gpuQuota": 8, "cohort": "research"},
    }
    fleet = lab_fleet({"only": {"gpus": 4}}, tenants=tenants, extra=classes)
    async with running_stack(temporal_client, sessions, tmp_path, fleet) as stack:
        body = {"gpu_count": 3, "priority_class": "pinned"}
        borrowing = await stack.http.post("/v1/allocations", json=body, headers=stack.acme)
        assert borrowing.status_code == 409, borrowing.text
        assert borrowing.json()["error"]["message"].endswith(
            "a non-preemptible PriorityClass is admitted only within its nominal quota, never on borrowed GPUs"
        )
        pinned = await stack.create(2, priority_class="pinned")  # within its quota of 2
        held = await stack.wait_for(pinned, "active")
        filler = await stack.create(2, who=stack.globex)  # the node's other 2 GPUs
        await stack.wait_for(filler, "active")

        # A higher priority of its own tenant may displace its lower priorities, but never this one: it waits.
        urgent = await stack.create(2, priority_class="urgent", queue={"timeout": "10m"})
        waiting = await stack.wait_for(urgent, "queued")
        assert waiting["state"] == "queued"
        assert (await stack.get(pinned))["state"] == "active"
        assert (await stack.get(pinned))["node"] == held["node"]
        for allocation, who in ((urgent, stack.acme), (pinned, stack.acme), (filler, stack.globex)):
            response = await stack.http.post(f"/v1/allocations/{allocation}/cancel", headers=who)
            assert response.status_code == 202, response.text
        for allocation in (urgent, pinned, filler):  # given back before the stack stops, not cut off by its stop
            await stack.wait_for(allocation, "cancelled")


async def test_explain_names_the_kueue_rule_and_never_another_tenants_allocation_or_name(
    temporal_client, sessions, tmp_path: Path
) -> None:
    tenants = {
        "acme": {"gpuQuota": 4, "cohort": "research", "preemption": {"reclaimWithinCohort": "Any"}},
        "globex": {"gpuQuota": 0, "cohort": "research"},
    }
    fleet = lab_fleet({"one": {"gpus": 4}, "two": {"gpus": 4}}, tenants=tenants, extra=BATCH)
    async with running_stack(temporal_client, sessions, tmp_path, fleet) as stack:
        borrowed = await stack.create(4, who=stack.globex, priority_class="batch")  # all of acme's quota
        await stack.wait_for(borrowed, "active")
        asked = {"gpu_count": 2, "region": "lab"}
        preview = (await stack.http.post("/v1/explain", json=asked, headers=stack.acme)).json()
        assert preview["refusal"]["code"] == "quota_exceeded"
        assert preview["preemption"]["case"] == "quota"
        assert preview["preemption"]["victims"] == [
            {
                "allocation_id": None,
                "node": preview["preemption"]["victims"][0]["node"],
                "gpus": 4,
                "priority": 0,
                "rule": "reclaimWithinCohort Any: its tenant borrows in cohort research (Kueue: InCohortReclamation)",
            }
        ]
        admin = (await stack.http.post("/v1/explain", json={**asked, "tenant": "acme"}, headers=stack.admin)).json()
        assert admin["preemption"]["victims"][0]["allocation_id"] == borrowed
        response = await stack.http.post(f"/v1/allocations/{borrowed}/cancel", headers=stack.globex)
        assert response.status_code == 202, response.text


def cohort(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "berth.dev/v1alpha1", "kind": "Cohort", "metadata": {"name": name}, "spec": spec}


async def test_two_level_cohorts_borrow_through_the_root_and_the_lender_reclaims_from_the_other_subtree(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """Kueue's hierarchical cohorts: blue's tenant borrows red's unused quota through their parent `org`, never more
    than the tree owns whatever hardware is free; red's tenant gets it back by preemption."""
    tenants = {
        "lender": {"gpuQuota": 4, "cohort": "red", "preemption": {"reclaimWithinCohort": "Any"}},
        "borrower": {"gpuQuota": 0, "cohort": "blue"},
    }
    tree = [cohort("org"), cohort("red", parentName="org"), cohort("blue", parentName="org")]
    fleet = lab_fleet(
        {"one": {"gpus": 4}, "two": {"gpus": 4}, "three": {"gpus": 4}}, tenants=tenants, extra=[*BATCH, *tree]
    )
    tag = uuid.uuid4().hex[:6]
    borrowed, more, reclaiming = f"tree-borrowed-{tag}", f"tree-more-{tag}", f"tree-reclaim-{tag}"
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        victim = await lab.allocate(borrowed, gpus=4, tenant="borrower", request_body={"priority_class": "batch"})
        await lab.wait_for_state(victim, "active")  # all of red's quota, through org
        beyond = await lab.allocate(more, gpus=1, tenant="borrower")  # 8 GPUs free, but the tree owns 4
        try:
            await beyond.result()
        except Exception as error:  # noqa: BLE001 - the failure's text is what a user reads
            assert "quota_exceeded" in str(error.cause), error.cause
        else:
            raise AssertionError("the borrower used more than its cohort tree owns")

        waiting = await lab.allocate(reclaiming, gpus=2, tenant="lender", queue=QueueWait(timeout_seconds=600))
        assert (await asyncio.wait_for(victim.result(), 60)).state == "preempted"
        await lab.wait_for_state(waiting, "active")
        queued = next(reason for step, _s, _n, reason in await lab.events(reclaiming) if step == "enter_queue")
        assert queued is not None and "but cohort red (in org) has lent it out" in queued
        notice = next(reason for step, _s, _n, reason in await lab.events(borrowed) if step == "preempt_notice")
        assert notice is not None and "its tenant borrows in cohort org (Kueue: InCohortReclamation)" in notice
        assert await lab.double_claims() == 0
        await allocation_client.release(temporal_client, reclaiming)


async def _two_borrowers(temporal_client, sessions, tmp_path: Path, *, fair: bool) -> tuple[str, str]:
    """Two tenants with no quota of their own share their cohort's 8 GPUs; b holds all 8 in four allocations when
    a asks for 2. (a's request's code after the first admission pass, the preempt notice b got or "").

    Kueue: without fair sharing a would still borrow once admitted and borrowWithinCohort is Never, so nothing is
    taken; with fair sharing a's share with its request (2/8) is below b's once one allocation is gone (6/8), so one
    of b's is preempted (InCohortFairSharing)."""
    tenants = {
        "a": {"gpuQuota": 0, "cohort": "lab", "preemption": {"reclaimWithinCohort": "Any"}},
        "b": {"gpuQuota": 0, "cohort": "lab"},
    }
    lab_cohort = cohort("lab", gpuQuota=8, fairSharing={"enabled": fair})
    fleet = lab_fleet({"one": {"gpus": 4}, "two": {"gpus": 4}}, tenants=tenants, extra=[*BATCH, lab_cohort])
    tag = uuid.uuid4().hex[:6]
    held = [f"fair-{fair}-b{n}-{tag}" for n in range(4)]
    asking = f"fair-{fair}-a-{tag}"
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path / str(fair), fleet) as lab:
        handles = [
            await lab.allocate(name, gpus=2, tenant="b", request_body={"priority_class": "batch"}) for name in held
        ]
        for handle in handles:
            await lab.wait_for_state(handle, "active")
        waiting = await lab.allocate(asking, gpus=2, tenant="a", queue=QueueWait(timeout_seconds=600))
        code, entered = None, False
        for _ in range(1200):  # until an admission pass has judged it in the queue, or it has left the queue
            async with sessions() as session:
                entry = await queue.entry(session, asking)
                state = await session.scalar(select(AllocationRow.state).where(AllocationRow.id == asking))
            entered = entered or entry is not None
            # Entering the queue writes the refusal that sent it there; an admission pass writes its own verdict
            # ("quota: ..." for a quota it is still refused by, or the preemption it decided).
            if entry is not None and (entry.code == "preempting" or (entry.reason or "").startswith("quota: ")):
                code = entry.code
                break
            if entered and entry is None and state not in (None, "pending", "queued"):
                code = state
                break
            await asyncio.sleep(0.05)
        if code == "preempting":
            await lab.wait_for_state(waiting, "active")  # its victim has left
        notices = [
            reason for name in held for step, _s, _n, reason in await lab.events(name) if step == "preempt_notice"
        ]
        # Everything ends before the next lab starts: the two share the database and the tenants' names.
        await allocation_client.cancel(temporal_client, asking)
        async with sessions() as session:
            states = dict((await session.execute(select(AllocationRow.id, AllocationRow.state))).all())
        for name in held:
            if states.get(name) == "active":
                await allocation_client.release(temporal_client, name)
        for handle in [*handles, waiting]:
            with contextlib.suppress(WorkflowFailureError):  # cancelled or preempted: ended all the same
                await asyncio.wait_for(handle.result(), 60)
        return code or "never judged", notices[0] if notices else ""


async def test_the_same_fleet_with_fair_sharing_off_and_on_decides_as_kueue_does(
    temporal_client, sessions, tmp_path: Path
) -> None:
    assert await _two_borrowers(temporal_client, sessions, tmp_path, fair=False) == ("quota_exceeded", "")
    code, notice = await _two_borrowers(temporal_client, sessions, tmp_path, fair=True)
    assert code == "preempting"
    assert "its tenant borrows in cohort lab (Kueue: InCohortFairSharing)" in notice


async def test_the_queue_names_each_victim_with_its_rule_and_a_tenant_never_sees_another_tenants_victim(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """`GET /v1/queues` for a queued request that is preempting: the admin reads each victim's id with its rule in
    Kueue's name; the preemptor's tenant reads the rule, never the other tenant's allocation id. With fair sharing
    on, each entry carries its tenant's share of what the cohort lends."""
    slow = [
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "PriorityClass",
            "metadata": {"name": "batch"},
            "spec": {"value": 0, "gracePeriod": "10m"},
        }
    ]  # the victim stays while the test reads
    tenants = {
        "acme": {"gpuQuota": 0, "cohort": "lab", "preemption": {"reclaimWithinCohort": "Any"}},
        "globex": {"gpuQuota": 0, "cohort": "lab"},
    }
    lab_cohort = cohort("lab", gpuQuota=4, fairSharing={"enabled": True})
    fleet = lab_fleet({"one": {"gpus": 4}}, tenants=tenants, extra=[*slow, lab_cohort])
    async with running_stack(temporal_client, sessions, tmp_path, fleet) as stack:
        held = [await stack.create(2, who=stack.globex, priority_class="batch") for _ in range(2)]
        for allocation in held:
            await stack.wait_for(allocation, "active")
        asking = await stack.create(2, queue={"timeout": "10m"})  # acme: 2/4 with it, globex 2/4 without one
        entry: dict[str, object] = {}
        for _ in range(600):
            regions = (await stack.http.get("/v1/queues", headers=stack.admin)).json()["regions"]
            entry = next((e for r in regions for e in r["entries"] if e["allocation_id"] == asking), {})
            if entry.get("code") == "preempting":
                break
            await asyncio.sleep(0.05)
        rule = "reclaimWithinCohort Any: its tenant borrows in cohort lab (Kueue: InCohortFairSharing)"
        victim = next(a for a in held if a in str(entry["reason"]))
        assert entry["reason"] == f"preempting 1 allocation(s) for its quota: {victim}: {rule}"
        assert entry["share"] == 0.0  # acme borrows nothing yet

        mine = (await stack.http.get("/v1/queues", headers=stack.acme)).json()["regions"][0]["entries"]
        assert [e["allocation_id"] for e in mine] == [asking]
        assert mine[0]["reason"] == f"preempting 1 allocation(s) for its quota: a request of another tenant: {rule}"
        placed = (await stack.http.get(f"/v1/allocations/{asking}", headers=stack.acme)).json()
        assert not any(a in str(placed) for a in held)

        for allocation, who in ((asking, stack.acme), *((a, stack.globex) for a in held)):
            response = await stack.http.post(f"/v1/allocations/{allocation}/cancel", headers=who)
            assert response.status_code in (202, 409), response.text  # 409: the victim may already be leaving
