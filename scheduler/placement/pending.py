"""Plans in progress: allocations being placed on a node that no claim records yet, seen by the next decision.

A node lease may exist for them on the host, or a queue's admission pass may have set the capacity aside for a
woken request (scheduler/admission/admit.py); either way the next decision must not count those slots as free. Which slots
is the node's decision; for ranking only the count matters.
"""

from __future__ import annotations

import dataclasses

from contracts.vocabulary import SlotState
from scheduler.snapshot import Snapshot
from scheduler.views import SlotView

Plans = dict[str, list[tuple[str, int]]]  # node -> [(allocation, GPUs)]


def with_pending_plans(snapshot: Snapshot, plans: Plans) -> Snapshot:
    """Count allocations being planned on a node as leasing that many of its free slots, so the next decision sees
    the last one and concurrent requests spread out instead of all trying the same node."""
    changed = [
        dataclasses.replace(
            snapshot.nodes[node], slots=tuple(_with_pending_leases(list(snapshot.nodes[node].slots), leases))
        )
        for node, leases in plans.items()
        if node in snapshot.nodes
    ]
    return snapshot.with_nodes(changed) if changed else snapshot


def _with_pending_leases(slots: list[SlotView], leases: list[tuple[str, int]]) -> list[SlotView]:
    """Mark free slots as leased for allocations being planned on the node (which slots is the node's decision;
    for ranking only the count matters). An allocation that already holds claims here needs no placeholder."""
    holding = {s.holder for s in slots if s.holder is not None}
    free = [i for i, s in enumerate(slots) if s.state is SlotState.FREE]
    result = list(slots)
    for allocation, gpus in leases:
        if allocation in holding:
            continue
        for i in free[:gpus]:
            result[i] = dataclasses.replace(result[i], state=SlotState.LEASED, holder=allocation)
        free = free[gpus:]
    return result


def seen_on(snapshot: Snapshot, plans: Plans, node: str) -> set[str]:
    """The allocations a ranking on `snapshot` saw on `node`: holding its slots (claims, leases) or planning there
    (`with_pending_plans` lays plans over free slots while there are any; `plans` has them all). What others took on
    the node since is what a first choice's record checks for room (`store.decisions.record_first_choice`)."""
    holding = {slot.holder for slot in snapshot.nodes[node].slots if slot.holder is not None}
    return holding | {allocation for allocation, _ in plans.get(node, [])}
