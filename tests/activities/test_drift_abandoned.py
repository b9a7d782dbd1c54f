"""The drift rules for an allocation whose workflow ended without finishing (terminated from the Temporal UI, say):
its row is closed, and `missing_vm`, whose advice is to release or cancel, is kept for allocations a workflow can
still release. Pure: facts in, findings out."""

from __future__ import annotations

from datetime import UTC, datetime

from activities.control.drift import assess
from contracts.audit import AllocationFact, ControlFacts, FindingKind, HostState, RepairAction

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def kinds(facts: ControlFacts) -> list[tuple[str, str | None, RepairAction | None, str | None]]:
    findings = assess(facts, [HostState(node="n1")], [], NOW, grace_seconds=600)
    return [(f.kind.value, f.allocation_id, f.repair, f.blocked) for f in findings]


def test_an_unfinished_allocation_whose_workflow_ended_is_closed() -> None:
    facts = ControlFacts(
        allocations=[
            AllocationFact(allocation_id="gone", state="active", node="n1"),
            AllocationFact(allocation_id="stuck", state="claiming", node="n1"),
            AllocationFact(allocation_id="live", state="provisioning", node="n1"),
        ],
        in_flight=["live"],
    )
    assert kinds(facts) == [
        ("abandoned_allocation", "gone", RepairAction.CLOSE_ALLOCATION, None),
        ("abandoned_allocation", "stuck", RepairAction.CLOSE_ALLOCATION, None),
    ]  # no missing_vm for `gone`: no workflow is left to release it; closing it is the repair


def test_an_active_allocation_in_flight_without_its_vm_is_still_missing_vm() -> None:
    facts = ControlFacts(
        allocations=[AllocationFact(allocation_id="lost", state="active", node="n1")], in_flight=["lost"]
    )
    findings = assess(facts, [HostState(node="n1")], [], NOW, grace_seconds=600)
    assert [(f.kind, f.repair) for f in findings] == [(FindingKind.MISSING_VM, None)]
