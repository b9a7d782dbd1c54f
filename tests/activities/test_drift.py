"""The reconciler's pure drift rules: each kind found from the facts alone, and the rules that keep repair safe (in
flight, grace period, a slot held by someone else, an agent that did not answer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.control.drift import IN_FLIGHT, assess
from contracts.audit import (
    AllocationFact,
    ClaimFact,
    ControlFacts,
    Finding,
    FindingKind,
    HostState,
    LeaseFact,
    NominationFact,
    RepairAction,
    ReservationFact,
    SlotFact,
    VmFact,
)

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
GRACE = 600.0


def vm(allocation: str, *slots: int, age: float = 30.0) -> VmFact:
    return VmFact(
        allocation_id=allocation,
        vm_id=f"vm-{allocation}",
        slot_indexes=list(slots),
        created_at=NOW - timedelta(seconds=age),
    )


def claim(allocation: str, node: str, index: int) -> ClaimFact:
    return ClaimFact(allocation_id=allocation, node=node, slot_id=hash((node, index)) % 10_000, slot_index=index)


def slot(node: str, index: int, state: str, reason: str | None = None) -> SlotFact:
    return SlotFact(
        node=node, slot_id=hash((node, index)) % 10_000, slot_index=index, state=state, quarantine_reason=reason
    )


def kinds(findings: list[Finding]) -> list[tuple[str, str | None, str | None, list[int]]]:
    return [(f.kind.value, f.node, f.allocation_id, f.slot_indexes) for f in findings]


def healthy() -> tuple[ControlFacts, list[HostState]]:
    """One active allocation with its claims, reserved slots and VM: no drift."""
    facts = ControlFacts(
        claims=[claim("a1", "n1", 0), claim("a1", "n1", 1)],
        slots=[slot("n1", 0, "reserved"), slot("n1", 1, "reserved")],
        allocations=[AllocationFact(allocation_id="a1", state="active", node="n1")],
        in_flight=["a1"],
    )
    return facts, [HostState(node="n1", vms=[vm("a1", 0, 1)])]


def test_a_consistent_fleet_has_no_findings() -> None:
    facts, hosts = healthy()
    assert assess(facts, hosts, [], NOW, GRACE) == []


def test_each_kind_of_drift_is_found_with_a_sentence() -> None:
    facts, hosts = healthy()
    facts = facts.model_copy(
        update={
            "claims": [*facts.claims, claim("gone", "n2", 0)],
            "slots": [
                *facts.slots,
                slot("n2", 0, "reserved"),
                slot("n2", 3, "reserved"),
                slot("n2", 2, "quarantined", "old: wipe not confirmed: agent_unreachable"),
            ],
            "allocations": [*facts.allocations, AllocationFact(allocation_id="lost", state="active", node="n2")],
            "in_flight": ["a1", "lost"],
        }
    )
    lease = LeaseFact(allocation_id="nobody", slot_indexes=[1], expires_at=NOW + timedelta(seconds=60))
    hosts = [
        *hosts,
        HostState(node="n2", vms=[vm("stray", 4)], leases=[lease]),
        HostState(node="n3", reachable=False, error="no pickup in 5s"),
    ]
    findings = assess(facts, hosts, [], NOW, GRACE)
    assert kinds(findings) == [
        ("agent_unreachable", "n3", None, []),
        ("missing_vm", "n2", "lost", []),
        ("orphan_lease", "n2", "nobody", [1]),
        ("orphan_vm", "n2", "stray", [4]),
        ("quarantine_wiped", "n2", "old", [2]),
        ("reserved_without_claim", "n2", None, [3]),
        ("stale_claim", "n2", "gone", [0]),
    ]
    by_kind = {f.kind: f for f in findings}
    assert "VM vm-stray on n2 (allocation stray, slots [4]) is accounted for by no active claim" in (
        by_kind[FindingKind.ORPHAN_VM].message
    )
    assert "no VM for it" in by_kind[FindingKind.MISSING_VM].message
    assert by_kind[FindingKind.MISSING_VM].repair is None  # never recreated by the reconciler
    assert all(f.first_seen == NOW for f in findings)
    assert {f.kind: f.repairable for f in findings} == {
        FindingKind.AGENT_UNREACHABLE: False,
        FindingKind.MISSING_VM: False,
        FindingKind.ORPHAN_LEASE: True,
        FindingKind.ORPHAN_VM: False,  # grace period: young and not seen before
        FindingKind.QUARANTINE_WIPED: True,
        FindingKind.RESERVED_WITHOUT_CLAIM: True,
        FindingKind.STALE_CLAIM: True,
    }


def test_an_orphan_vm_is_destroyed_only_when_seen_again_or_old() -> None:
    facts = ControlFacts()
    first = assess(facts, [HostState(node="n", vms=[vm("x", 0)])], [], NOW, GRACE)
    assert first[0].blocked is not None and first[0].blocked.startswith("grace period")
    later = NOW + timedelta(seconds=60)
    second = assess(facts, [HostState(node="n", vms=[vm("x", 0)])], first, later, GRACE)
    assert (second[0].repair, second[0].blocked, second[0].first_seen) == (RepairAction.DESTROY_VM, None, NOW)
    old = assess(facts, [HostState(node="n", vms=[vm("x", 0, age=GRACE + 1)])], [], NOW, GRACE)
    assert old[0].repairable


def test_nothing_of_an_allocation_in_flight_is_repaired() -> None:
    facts = ControlFacts(in_flight=["x"], slots=[slot("n", 1, "quarantined", "x: wipe not confirmed")])
    lease = LeaseFact(allocation_id="x", slot_indexes=[2], expires_at=NOW + timedelta(seconds=5))
    findings = assess(facts, [HostState(node="n", vms=[vm("x", 0, age=9999)], leases=[lease])], [], NOW, GRACE)
    # the VM without a claim yet is reported (a placement may be between steps) but never destroyed
    assert [(f.kind.value, f.blocked) for f in findings] == [
        ("orphan_vm", IN_FLIGHT),
        ("quarantine_wiped", IN_FLIGHT),
    ]


def test_a_vm_on_a_slot_held_by_another_allocation_is_never_destroyed() -> None:
    facts = ControlFacts(claims=[claim("owner", "n", 0)], in_flight=["owner"])
    host = HostState(node="n", vms=[vm("owner", 0), vm("intruder", 0, age=9999)])
    [finding] = assess(facts, [host], [], NOW, GRACE)
    assert finding.allocation_id == "intruder"
    assert finding.blocked == "slot 0 is also held by allocation owner: destroying the VM would wipe it"


def test_slots_are_not_freed_under_a_vm_or_lease_nor_on_an_unreachable_host() -> None:
    facts = ControlFacts(
        slots=[slot("n", 0, "reserved"), slot("n", 1, "quarantined", "q: x"), slot("gone", 0, "reserved")]
    )
    host = HostState(
        node="n",
        vms=[vm("stray", 0)],
        leases=[LeaseFact(allocation_id="stray", slot_indexes=[1], expires_at=NOW + timedelta(seconds=5))],
    )
    findings = assess(facts, [host, HostState(node="gone", reachable=False)], [], NOW, GRACE)
    blocked = {(f.kind.value, f.node): f.blocked for f in findings}
    assert blocked[("reserved_without_claim", "n")] == "allocation stray has a VM or a live lease on it"
    assert blocked[("reserved_without_claim", "gone")] == "no answer from the agent of gone: the slot cannot be wiped"
    assert ("quarantine_wiped", "n") not in blocked  # still in use: not wiped, not reported as wipeable


def test_a_stale_claim_with_its_vm_still_there_waits_for_the_grace_period() -> None:
    facts = ControlFacts(claims=[claim("dead", "n", 0)])
    [young] = assess(facts, [HostState(node="n", vms=[vm("dead", 0)])], [], NOW, GRACE)
    assert young.kind is FindingKind.STALE_CLAIM and "still on the host" in young.message
    assert young.blocked is not None and young.blocked.startswith("grace period")
    agent, unreachable = assess(facts, [HostState(node="n", reachable=False)], [], NOW, GRACE)
    assert agent.kind is FindingKind.AGENT_UNREACHABLE
    assert unreachable.kind is FindingKind.STALE_CLAIM
    assert unreachable.blocked == "no answer from the agent of n: the slots cannot be wiped"
    [no_vm] = assess(facts, [HostState(node="n")], [], NOW, GRACE)
    assert (no_vm.repair, no_vm.blocked) == (RepairAction.TEARDOWN, None)


def test_an_expired_lease_is_left_to_the_reaper() -> None:
    lease = LeaseFact(allocation_id="x", slot_indexes=[0], expires_at=NOW - timedelta(seconds=1))
    assert assess(ControlFacts(), [HostState(node="n", leases=[lease])], [], NOW, GRACE) == []


def test_a_node_held_for_a_preemptor_and_taken_by_another_allocation_is_reported() -> None:
    """A nominated node goes to its preemptor alone. Claims there of its victims, of the preemptor
    and of allocations that held slots before the nomination are fine; one claimed after it by anyone else is not."""
    decided = NOW - timedelta(seconds=60)

    def at(allocation: str, index: int, seconds_ago: float) -> ClaimFact:
        return claim(allocation, "n", index).model_copy(update={"claimed_at": NOW - timedelta(seconds=seconds_ago)})

    facts = ControlFacts(
        claims=[at("victim", 0, 300), at("before", 1, 300), at("preemptor", 2, 10), at("intruder", 3, 10)],
        nominations=[NominationFact(allocation_id="preemptor", node="n", victims=["victim"], nominated_at=decided)],
        in_flight=["victim", "before", "preemptor", "intruder"],
    )
    found = [f for f in assess(facts, [], [], NOW, GRACE) if f.kind is FindingKind.NOMINATION_TAKEN]
    assert kinds(found) == [("nomination_taken", "n", "intruder", [3])]
    assert found[0].repair is None  # reported, never repaired
    assert "held for queued request preemptor" in found[0].message


def test_a_node_that_promised_a_reservations_gpus_twice_is_reported_naming_what_holds_them() -> None:
    """Node `n` has 4 GPUs; a reservation wants 2 of them from an hour on. Held then: `forever` (1 GPU, no end),
    the preemptor nominated there (1 GPU, its victim `victim` does not count: it leaves), and reservation `r2` (1 GPU,
    overlapping): 3, so only 1 is left. `ends` (its lease over before the start) and `spot` (preemptible: preempted
    at the start) hold nothing then. A reservation on `m` with room is not reported."""
    start = NOW + timedelta(hours=1)

    def reservation(name: str, node: str, gpus: int, hours: float = 2) -> ReservationFact:
        return ReservationFact(
            reservation_id=name,
            node=node,
            gpus=gpus,
            starts_at=start,
            ends_at=start + timedelta(hours=hours),
            node_gpus=4,
        )

    facts = ControlFacts(
        claims=[
            claim("forever", "n", 0),
            claim("ends", "n", 1),
            claim("spot", "n", 2),
            claim("victim", "n", 3),
            claim("other", "m", 0),
        ],
        allocations=[
            AllocationFact(allocation_id="forever", state="active", node="n"),
            AllocationFact(allocation_id="ends", state="active", node="n", ends_at=start - timedelta(minutes=1)),
            AllocationFact(allocation_id="spot", state="active", node="n", preemptible=True),
            AllocationFact(allocation_id="victim", state="preempting", node="n"),
            AllocationFact(allocation_id="other", state="active", node="m"),
        ],
        nominations=[NominationFact(allocation_id="preemptor", node="n", victims=["victim"], nominated_at=NOW, gpus=1)],
        reservations=[reservation("r1", "n", 2), reservation("r2", "n", 1), reservation("fits", "m", 3)],
    )
    found = [f for f in assess(facts, [], [], NOW, GRACE) if f.kind is FindingKind.RESERVATION_OVERBOOKED]
    assert kinds(found) == [("reservation_overbooked", "n", None, [])]
    assert found[0].repair is None  # reported, never repaired
    message = found[0].message
    assert "reservation r1 (2 GPUs from 2025-01-01 13:00:00 UTC) finds 1 of 4 free then" in message
    assert "allocation forever (no end): 1" in message and "preemptor preemptor, nominated: 1" in message
    assert "reservation r2: 1" in message
    assert "ends" not in message and "spot" not in message and "victim" not in message and "fits" not in message

    # The reservation alone on `n` with the allocations that do not hold at its start: no finding.
    fine = facts.model_copy(update={"nominations": [], "reservations": [reservation("r1", "n", 2)]})
    fine = fine.model_copy(update={"claims": [c for c in facts.claims if c.allocation_id != "forever"]})
    assert not [f for f in assess(fine, [], [], NOW, GRACE) if f.kind is FindingKind.RESERVATION_OVERBOOKED]
