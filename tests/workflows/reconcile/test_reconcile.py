"""The reconciler against a real PostgreSQL, a real Temporal server and real node-agent workers (simulated hosts):
every kind of drift made by hand, found, and the safe ones healed by `repair`, each fix in the audit trail.

Hosts: `n1` and `n2` (4 GPUs each) hold two real allocations and the hand-made drift; `n3`'s agent reported and then
stopped, so it is live in PostgreSQL but answers nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select, text, update
from temporalio.client import Client, ScheduleActionStartWorkflow, ScheduleOverlapPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from agent.drivers import VmRecord
from agent.leases import Lease
from contracts.audit import AuditReport, FindingKind
from contracts.task_queues import Queues
from store.audit import AuditRepairRow
from store.models import AllocationRow, ClaimRow, SlotRow
from tests.ledger import billed
from tests.workflows.lab import Lab, lab_fleet, running_lab
from workflows.reconcile.client import ReconcilerSettings, ensure_schedule, run_now
from workflows.reconcile.workflow import ReconcileInput, ReconcileWorkflow

HOSTS = {"n1": {"gpus": 4}, "n2": {"gpus": 4}, "n3": {"gpus": 1}}


async def audit(lab: Lab, client: Client, repair: bool = False) -> AuditReport:
    input = ReconcileInput(repair=repair, trigger="test", agent_pickup_seconds=1.0, queues=lab.queues)
    return await run_now(client, input, wait_seconds=60)


def found(report: AuditReport) -> list[tuple[str, str | None, str | None, list[int]]]:
    return [(f.kind.value, f.node, f.allocation_id, f.slot_indexes) for f in report.findings]


async def free_slots(lab: Lab, node: str) -> list[int]:
    states = await lab.slot_states()
    return sorted(
        int(key.split("/")[1]) for key, state in states.items() if key.startswith(f"{node}/") and state == "available"
    )


async def set_slot(lab: Lab, node: str, index: int, **values: object) -> int:
    async with lab.sessions.begin() as session:
        slot = (
            await session.scalars(select(SlotRow).where(SlotRow.node_id == node, SlotRow.slot_index == index))
        ).one()
        await session.execute(update(SlotRow).where(SlotRow.id == slot.id).values(**values))
        return slot.id


async def test_each_drift_is_found_and_the_safe_ones_healed(temporal_client: Client, sessions, tmp_path: Path) -> None:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(HOSTS)) as lab:
        await lab.stop_agent("n3")  # reported (live in PostgreSQL), now answers nothing
        kept = await lab.wait_for_state(await lab.allocate("kept", gpus=2, nodes=frozenset({"n1"})), "active")
        lost = await lab.wait_for_state(await lab.allocate("lost", gpus=2, nodes=frozenset({"n1"})), "active")
        # 1. missing_vm: someone deleted the VM of an active allocation by hand
        (tmp_path / "nodes" / "n1" / "vms" / "lost.json").unlink()
        # 2. orphan_vm: a VM on n2 that no claim accounts for
        free = await free_slots(lab, "n2")
        assert free == [0, 1, 2, 3]
        stray = VmRecord(
            vm_id="vm-stray", allocation_id="stray", slot_indexes=[0], created_at=datetime.now(UTC).timestamp()
        )
        (tmp_path / "nodes" / "n2" / "vms" / "stray.json").write_text(stray.model_dump_json())
        # 3. stale_claim: a claim whose workflow never existed
        ghost_slot = await set_slot(lab, "n2", 1, state="reserved")
        async with lab.sessions.begin() as session:
            session.add(
                AllocationRow(
                    id="ghost",
                    tenant="acme",
                    state="failed",
                    shape="gpu_slice",
                    gpu_count=1,
                    request={},
                    workflow_id="allocation/ghost",
                    node_id="n2",
                )
            )
            await session.flush()
            session.add(ClaimRow(allocation_id="ghost", attempt=1, slot_id=ghost_slot, node_id="n2", bundle={}))
        # 4. reserved_without_claim
        await set_slot(lab, "n2", 2, state="reserved")
        # 5. quarantine_wiped: quarantined by a teardown that could not reach the host, which is fine now
        await set_slot(
            lab, "n2", 3, state="quarantined", quarantine_reason="old: wipe not confirmed: agent_unreachable"
        )
        # 6. orphan_lease: a live lease file for an allocation nobody is placing
        bundle = kept.bundles[0].model_copy(update={"slot_index": 3, "slot_id": "n2/3"})
        lease = Lease(
            allocation_id="nobody",
            task_id="t",
            node="n2",
            slot_ids=["n2/3"],
            devices=[bundle],
            expires_at=datetime.now(UTC) + timedelta(minutes=5),
        )
        lab.agent("n2").leases.write(lease)
        # 7. usage_drift: someone's hand lost the usage ledger's interval of an active allocation
        async with lab.sessions.begin() as session:
            await session.execute(text("DELETE FROM usage_intervals WHERE subject = 'kept'"))

        first = await audit(lab, temporal_client)
        assert found(first) == [
            ("agent_unreachable", "n3", None, []),
            ("missing_vm", "n1", "lost", sorted(b.slot_index for b in lost.bundles)),
            ("orphan_lease", "n2", "nobody", [3]),
            ("orphan_vm", "n2", "stray", [0]),
            ("reserved_without_claim", "n2", None, [2]),
            ("stale_claim", "n2", "ghost", [1]),
            ("usage_drift", None, "kept", []),
        ]  # slot 3 is still under the live lease: not yet wipeable
        orphan = next(f for f in first.findings if f.kind is FindingKind.ORPHAN_VM)
        assert orphan.blocked is not None and orphan.blocked.startswith("grace period")
        assert first.repairs == [] and first.nodes_checked == ["n1", "n2", "n3"]

        repaired = await audit(lab, temporal_client, repair=True)
        done = {(r.kind.value, r.outcome) for r in repaired.repairs}
        assert done == {
            ("orphan_lease", "done"),
            ("orphan_vm", "done"),
            ("reserved_without_claim", "done"),
            ("stale_claim", "done"),
            ("usage_drift", "done"),
        }
        assert next(f for f in repaired.findings if f.kind is FindingKind.ORPHAN_VM).first_seen == orphan.first_seen
        assert sorted(p.name for p in lab.vm_records()) == ["kept.json"]  # the stray VM is gone, kept is kept
        assert lab.lease_files() == []
        states = await lab.slot_states()
        assert [states[f"n2/{i}"] for i in range(4)] == ["available", "available", "available", "quarantined"]
        assert "ghost" not in await lab.active_claims() and "kept" in await lab.active_claims()
        assert ("reconciler_teardown", "failed", "n2") == (await lab.events("ghost"))[-1][:3]
        assert await billed(lab.sessions, "kept") == [(1, 2, None)]  # rebuilt from its claims, still held
        assert (await billed(lab.sessions, "ghost"))[0][:2] == (1, 1)  # billed until the reconciler released it
        async with lab.sessions() as session:
            trail = (await session.execute(select(AuditRepairRow.kind, AuditRepairRow.outcome))).all()
        assert sorted(trail) == sorted(done)

        # the lease is gone, so the quarantined slot is now wipeable: the next repairing audit lifts it
        lifted = await audit(lab, temporal_client, repair=True)
        assert {(r.kind.value, r.outcome) for r in lifted.repairs} == {("quarantine_wiped", "done")}
        assert (await lab.slot_states())["n2/3"] == "available"
        wipes = (tmp_path / "nodes" / "n2" / "wipes.log").read_text()
        assert '"slots": [3]' in wipes and '"slots": [0]' in wipes and '"slots": [2]' in wipes

        last = await audit(lab, temporal_client)
        assert [f.kind.value for f in last.findings] == ["agent_unreachable", "missing_vm"]  # never auto-repaired
        assert (await lab.slot_states())["n1/0"] == "reserved"  # the active allocations are untouched
        handle = temporal_client.get_workflow_handle(repaired.workflow_id or "")
        history = await handle.fetch_history()
    await Replayer(workflows=[ReconcileWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)


async def test_the_control_worker_creates_the_schedule_once(temporal_client: Client) -> None:
    settings = ReconcilerSettings(schedule_id=f"berth-reconciler-{uuid.uuid4().hex[:8]}", every_seconds=60)
    queues = Queues(control="test-schedule.control", node_prefix="test-schedule.node.")
    assert await ensure_schedule(temporal_client, queues, settings) is True
    try:
        assert await ensure_schedule(temporal_client, queues, settings) is False  # a restarted worker leaves it be
        described = await temporal_client.get_schedule_handle(settings.schedule_id).describe()
        schedule = described.schedule
        assert schedule.policy.overlap is ScheduleOverlapPolicy.SKIP
        assert [spec.every for spec in schedule.spec.intervals] == [timedelta(seconds=60)]
        assert isinstance(schedule.action, ScheduleActionStartWorkflow)
        assert (schedule.action.workflow, schedule.action.task_queue) == ("Reconcile", "test-schedule.control")
    finally:
        await temporal_client.get_schedule_handle(settings.schedule_id).delete()
