"""Drift: where PostgreSQL, Temporal and the hosts disagree, and what it is safe to do about it. Pure: no I/O, no clock
(`now` comes in), same facts in, same findings out.

    PostgreSQL  active claims, reserved and quarantined slots, unfinished allocations
    Temporal    allocations in flight (an open allocation or slot-recovery workflow)
    hosts       each reachable agent's own VMs and live leases
        -> findings by kind, each with the repair `--repair` would run, or why it will not run now

The rules that keep repair safe live here, in one place:
- nothing of an allocation in flight is ever repaired: its workflow is still acting on it;
- nothing is judged on a host whose agent did not answer (`agent_unreachable`), and nothing there is repaired;
- a VM is destroyed only once it was already found in the previous audit or is older than the grace period, and
  never when one of its slots is held by another allocation (destroying it wipes its slots);
- a slot is freed or un-quarantined only when no VM or live lease on its host uses it (the agent wipes it first);
- a node's GPUs are promised at most once at any instant: to the allocations holding them (until their ends), a
  preemptor nominated there, and the reservations whose windows cover it; a node that promised more is reported,
  never repaired (which promise to break is an operator's call);
- an allocation is closed (its row made final) only when its workflow is no longer running: terminated from the
  Temporal UI, say, which skips the compensation that gives capacity back. What it held is found by the other rules
  (`stale_claim`, `orphan_lease`, `orphan_vm`) and repaired by them; closing it only stops its row from claiming that
  something is still under way, which nothing would ever move on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from contracts.audit import ControlFacts, Finding, FindingKind, HostState, RepairAction, VmFact

IN_FLIGHT = "its allocation's workflow is still open"


def assess(
    facts: ControlFacts, hosts: Iterable[HostState], previous: Iterable[Finding], now: datetime, grace_seconds: float
) -> list[Finding]:
    """Every drift between the three sources, ordered by kind, node, allocation and slots."""
    return _Audit(facts, list(hosts), list(previous), now, grace_seconds).findings()


class _Audit:
    def __init__(
        self, facts: ControlFacts, hosts: list[HostState], previous: list[Finding], now: datetime, grace: float
    ) -> None:
        self.facts = facts
        self.now = now
        self.grace = grace
        self.seen_before = {finding.key(): finding.first_seen for finding in previous}
        self.in_flight = set(facts.in_flight)
        self.hosts = {host.node: host for host in hosts if host.reachable}
        self.unreachable = [host for host in hosts if not host.reachable]
        self.claims: dict[tuple[str, str], list[int]] = defaultdict(list)  # (allocation, node) -> slot indexes
        self.claimed: dict[tuple[str, int], str] = {}  # (node, slot index) -> allocation
        for claim in facts.claims:
            self.claims[(claim.allocation_id, claim.node)].append(claim.slot_index)
            self.claimed[(claim.node, claim.slot_index)] = claim.allocation_id
        self.claimed_slot_ids = {claim.slot_id for claim in facts.claims}
        self.used: dict[tuple[str, int], str] = {}  # (node, slot index) -> allocation of a VM or live lease there
        for host in self.hosts.values():
            for lease in host.leases:
                if lease.expires_at > now:
                    self.used.update({(host.node, index): lease.allocation_id for index in lease.slot_indexes})
            for vm in host.vms:
                self.used.update({(host.node, index): vm.allocation_id for index in vm.slot_indexes})

    def finding(
        self,
        kind: FindingKind,
        message: str,
        *,
        node: str | None = None,
        allocation: str | None = None,
        slots: Iterable[int] = (),
        repair: RepairAction | None = None,
        blocked: str | None = None,
    ) -> Finding:
        draft = Finding(
            kind=kind,
            node=node,
            allocation_id=allocation,
            slot_indexes=sorted(slots),
            message=message,
            first_seen=self.now,
            repair=repair,
            blocked=blocked if repair is not None else None,
        )
        first_seen = self.seen_before.get(draft.key())
        return draft.model_copy(update={"first_seen": first_seen}) if first_seen is not None else draft

    def findings(self) -> list[Finding]:
        found = [
            *self.agents_unreachable(),
            *self.orphan_vms(),
            *self.orphan_leases(),
            *self.stale_claims(),
            *self.missing_vms(),
            *self.slots(),
            *self.abandoned_allocations(),
            *self.nominations_taken(),
            *self.reservations_overbooked(),
            *self.abandoned_reservations(),
            *self.gpu_failures_untold(),
            *self.usage_drifts(),
        ]
        return sorted(found, key=lambda f: (f.kind.value, f.node or "", f.allocation_id or "", f.slot_indexes))

    def agents_unreachable(self) -> Iterable[Finding]:
        for host in self.unreachable:
            yield self.finding(
                FindingKind.AGENT_UNREACHABLE,
                f"the agent of {host.node} did not answer ({host.error or 'no reason given'}); its VMs and leases "
                "were not checked and nothing on it is judged or repaired",
                node=host.node,
            )

    def orphan_vms(self) -> Iterable[Finding]:
        for node, host in sorted(self.hosts.items()):
            for vm in host.vms:
                if (vm.allocation_id, node) in self.claims:
                    continue
                yield self.finding(
                    FindingKind.ORPHAN_VM,
                    f"VM {vm.vm_id} on {node} (allocation {vm.allocation_id}, slots {sorted(vm.slot_indexes)}) is "
                    "accounted for by no active claim",
                    node=node,
                    allocation=vm.allocation_id,
                    slots=vm.slot_indexes,
                    repair=RepairAction.DESTROY_VM,
                    blocked=self.vm_blocked(FindingKind.ORPHAN_VM, node, vm),
                )

    def vm_blocked(self, kind: FindingKind, node: str, vm: VmFact) -> str | None:
        """Why a VM may not be destroyed now, or None."""
        if vm.allocation_id in self.in_flight:
            return IN_FLIGHT
        for index in sorted(vm.slot_indexes):
            for holders in (self.claimed, self.used):
                holder = holders.get((node, index))
                if holder is not None and holder != vm.allocation_id:
                    return f"slot {index} is also held by allocation {holder}: destroying the VM would wipe it"
        key = (kind.value, node, vm.allocation_id, tuple(sorted(vm.slot_indexes)))
        age = (self.now - vm.created_at).total_seconds()
        if key not in self.seen_before and age < self.grace:
            return f"grace period: destroyed once found again by the next audit or {self.grace:g} s after its creation"
        return None

    def orphan_leases(self) -> Iterable[Finding]:
        for node, host in sorted(self.hosts.items()):
            for lease in host.leases:
                if lease.expires_at <= self.now or lease.allocation_id in self.in_flight:
                    continue
                yield self.finding(
                    FindingKind.ORPHAN_LEASE,
                    f"a lease on {node} for allocation {lease.allocation_id} holds slots {sorted(lease.slot_indexes)} "
                    f"until {lease.expires_at:%Y-%m-%d %H:%M:%S} UTC, but no allocation is in flight for it",
                    node=node,
                    allocation=lease.allocation_id,
                    slots=lease.slot_indexes,
                    repair=RepairAction.RELEASE_LEASE,
                )

    def stale_claims(self) -> Iterable[Finding]:
        for (allocation, node), indexes in sorted(self.claims.items()):
            if allocation in self.in_flight:
                continue
            host = self.hosts.get(node)
            vm = next((v for v in host.vms if v.allocation_id == allocation), None) if host else None
            if host is None:
                blocked: str | None = f"no answer from the agent of {node}: the slots cannot be wiped"
            elif vm is not None:
                blocked = self.vm_blocked(FindingKind.STALE_CLAIM, node, vm)
            else:
                blocked = None
            yield self.finding(
                FindingKind.STALE_CLAIM,
                f"allocation {allocation} actively claims slots {sorted(indexes)} of {node}, but its workflow is "
                "finished or gone" + (f"; its VM {vm.vm_id} is still on the host" if vm else ""),
                node=node,
                allocation=allocation,
                slots=indexes,
                repair=RepairAction.TEARDOWN,
                blocked=blocked,
            )

    def missing_vms(self) -> Iterable[Finding]:
        """Only while the allocation's workflow runs: that workflow can still release it (an abandoned one is closed
        instead, and its claims found stale)."""
        for allocation in self.facts.allocations:
            host = self.hosts.get(allocation.node or "")
            if (
                allocation.state not in ("active", "preempting", "degraded")
                or host is None
                or allocation.allocation_id not in self.in_flight
            ):
                continue
            if any(vm.allocation_id == allocation.allocation_id for vm in host.vms):
                continue
            yield self.finding(
                FindingKind.MISSING_VM,
                f"allocation {allocation.allocation_id} is active on {host.node}, but the host has no VM for it; "
                "the reconciler cannot recreate it: release or cancel the allocation",
                node=host.node,
                allocation=allocation.allocation_id,
                slots=self.claims.get((allocation.allocation_id, host.node), []),
            )

    def slots(self) -> Iterable[Finding]:
        for slot in self.facts.slots:
            host = self.hosts.get(slot.node)
            user = self.used.get((slot.node, slot.slot_index))
            if host is None:
                blocked: str | None = f"no answer from the agent of {slot.node}: the slot cannot be wiped"
            elif user is not None:
                blocked = f"allocation {user} has a VM or a live lease on it"
            else:
                blocked = None
            if slot.state == "reserved" and slot.slot_id not in self.claimed_slot_ids:
                yield self.finding(
                    FindingKind.RESERVED_WITHOUT_CLAIM,
                    f"slot {slot.slot_index} of {slot.node} is reserved, but no active claim holds it",
                    node=slot.node,
                    slots=[slot.slot_index],
                    repair=RepairAction.FREE_SLOT,
                    blocked=blocked,
                )
            elif slot.state == "quarantined" and host is not None and user is None:
                owner = (slot.quarantine_reason or "").split(":", 1)[0].strip() or None
                yield self.finding(
                    FindingKind.QUARANTINE_WIPED,
                    f"slot {slot.slot_index} of {slot.node} is quarantined ({slot.quarantine_reason or 'no reason'}), "
                    "but its agent is back and no VM uses it: a wipe now lifts the quarantine",
                    node=slot.node,
                    allocation=owner,
                    slots=[slot.slot_index],
                    repair=RepairAction.LIFT_QUARANTINE,
                    blocked=IN_FLIGHT if owner in self.in_flight else None,
                )

    def abandoned_allocations(self) -> Iterable[Finding]:
        for allocation in self.facts.allocations:
            if allocation.allocation_id in self.in_flight:
                continue
            yield self.finding(
                FindingKind.ABANDONED_ALLOCATION,
                f"allocation {allocation.allocation_id} is {allocation.state} in PostgreSQL, but its workflow is no "
                "longer running (terminated, timed out or gone), so nothing will move it on or give back what it held; "
                "closing it records it as failed with the reason",
                allocation=allocation.allocation_id,
                repair=RepairAction.CLOSE_ALLOCATION,
            )

    def nominations_taken(self) -> Iterable[Finding]:
        """A node held for a preemptor must go to it alone: an allocation other than its victims and itself that
        claimed slots there after the nomination broke that promise. Reported, never repaired: the allocation holds
        the slots now, and the preemptor waits for a later pass."""
        for nomination in self.facts.nominations:
            allowed = {nomination.allocation_id, *nomination.victims}
            taken: dict[str, list[int]] = defaultdict(list)
            for claim in self.facts.claims:
                if claim.node != nomination.node or claim.allocation_id in allowed or claim.claimed_at is None:
                    continue
                if claim.claimed_at > nomination.nominated_at:
                    taken[claim.allocation_id].append(claim.slot_index)
            for allocation, slots in sorted(taken.items()):
                yield self.finding(
                    FindingKind.NOMINATION_TAKEN,
                    f"{nomination.node} is held for queued request {nomination.allocation_id} (its preemption was "
                    f"decided at {nomination.nominated_at:%Y-%m-%d %H:%M:%S} UTC), but allocation {allocation} "
                    f"claimed slots {sorted(slots)} there after that",
                    node=nomination.node,
                    allocation=allocation,
                    slots=slots,
                )

    def reservations_overbooked(self) -> Iterable[Finding]:
        """No GPU is held by two of an active allocation, a nomination and a reservation's window: at each held
        reservation's start, its node's allocations still holding then (not preemptible: those are preempted at the
        start; not a nominated preemptor's victims: the preemptor takes their place), its nominated preemptors and
        the other reservations overlapping it leave the reservation its GPUs. One finding per node, naming every
        reservation short and what holds the node then."""
        allocations = {a.allocation_id: a for a in self.facts.allocations}
        by_node: dict[str, list[str]] = defaultdict(list)
        for reservation in sorted(self.facts.reservations, key=lambda r: (r.node, r.starts_at, r.reservation_id)):
            node, start = reservation.node, reservation.starts_at
            victims = {v for n in self.facts.nominations if n.node == node for v in n.victims}
            holders: list[tuple[str, int]] = []
            for (allocation_id, claim_node), slots in sorted(self.claims.items()):
                fact = allocations.get(allocation_id)
                if claim_node != node or allocation_id in victims or (fact is not None and fact.preemptible):
                    continue
                if fact is None or fact.ends_at is None or fact.ends_at > start:
                    until = "no end" if fact is None or fact.ends_at is None else f"until {fact.ends_at:%Y-%m-%d %H:%M}"
                    holders.append((f"allocation {allocation_id} ({until})", len(slots)))
            holders += [
                (f"preemptor {n.allocation_id}, nominated", n.gpus) for n in self.facts.nominations if n.node == node
            ]
            holders += [
                (f"reservation {other.reservation_id}", other.gpus)
                for other in self.facts.reservations
                if other is not reservation
                and other.node == node
                and other.starts_at < reservation.ends_at
                and reservation.starts_at < other.ends_at
            ]
            held = sum(gpus for _, gpus in holders)
            if held + reservation.gpus > reservation.node_gpus:
                named = ", ".join(f"{who}: {gpus}" for who, gpus in holders)
                by_node[node].append(
                    f"reservation {reservation.reservation_id} ({reservation.gpus} GPUs from {start:%Y-%m-%d %H:%M:%S} "
                    f"UTC) finds {max(reservation.node_gpus - held, 0)} of {reservation.node_gpus} free then ({named})"
                )
        for node, short in sorted(by_node.items()):
            yield self.finding(
                FindingKind.RESERVATION_OVERBOOKED, f"{node} promised GPUs twice: " + "; ".join(short), node=node
            )

    def abandoned_reservations(self) -> Iterable[Finding]:
        """A reservation open in PostgreSQL whose workflow ended (terminated from the Temporal UI, say) holds its
        window's GPUs until the window's end with nothing to start or end it. Reported, not repaired: cancelling it
        (`berth reservations cancel`) records it as cancelled, which is the operator's call to make."""
        running = set(self.facts.reservations_in_flight)
        for reservation in self.facts.open_reservations:
            if reservation.reservation_id in running:
                continue
            yield self.finding(
                FindingKind.ABANDONED_RESERVATION,
                f"reservation {reservation.reservation_id} is {reservation.state} in PostgreSQL, but its workflow is no "
                "longer running (terminated, timed out or gone): nothing will start or end it, and its GPUs stay "
                f"promised until its window ends; `berth reservations cancel {reservation.reservation_id}` closes it",
                node=reservation.node,
            )

    def usage_drifts(self) -> Iterable[Finding]:
        """The usage ledger disagrees with an allocation's claims (someone's hand in the database, or history from
        before the ledger): the repair rebuilds its intervals from the claims, which are the truth of what it held."""
        by_allocation: dict[str, list[str]] = {}
        for found in self.facts.usage_drift:
            by_allocation.setdefault(found.allocation_id, []).append(found.message)
        for allocation, messages in sorted(by_allocation.items()):
            yield self.finding(
                FindingKind.USAGE_DRIFT,
                "; ".join(messages) + ": rebuilding its intervals from its claims fixes it",
                allocation=allocation,
                repair=RepairAction.REBUILD_USAGE,
            )

    def gpu_failures_untold(self) -> Iterable[Finding]:
        """An allocation still `active` on a slot whose GPU failed was not told (the API's signal was lost): the
        repair tells it, and it goes `degraded`."""
        states = {a.allocation_id: a.state for a in self.facts.allocations}
        for failed in self.facts.failed_slots:
            holder = self.claimed.get((failed.node, failed.slot_index))
            if holder is None or states.get(holder) != "active":
                continue
            yield self.finding(
                FindingKind.GPU_FAILURE_UNTOLD,
                f"allocation {holder} is active on slot {failed.slot_index} of {failed.node}, whose GPU failed "
                f"({failed.reason or 'no reason recorded'}), and was not told: telling it makes it degraded",
                node=failed.node,
                allocation=holder,
                slots=[failed.slot_index],
                repair=RepairAction.TELL_ALLOCATION,
            )
