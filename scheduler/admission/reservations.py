"""Reservations: GPUs promised for a future window `[start, end)`, in the manner of AWS Capacity Blocks,
GCP calendar-mode reservations and Slurm reservations.

    admit    a reservation is admitted only if one node of the pools serving its shape can hold it then: the node's
             GPUs, less those of running allocations still holding them at the window's start (no end, or an end
             after it; a preemptible one does not count: it is preempted at the start), less those of every other
             reservation whose window overlaps. Of the nodes that can, the one left with the least room (binpack).
    refuse   otherwise the refusal says what the window lacks (the most any node has then) and the nearest windows of
             the same length that would fit, starting when a running allocation ends or another reservation does.
    extend   an allocation's end moves later only as far as the reservations of its node allow: up to the start of
             the first one that would otherwise not find its GPUs free (`latest_end`).
    hold     until its allocation holds the GPUs, the reservation holds them for every request that would overlap its
             window: a request with no end, or one ending after the window starts, sees those slots as taken; one
             ending before it, or of a preemptible class, may use them (`with_holds`).

Times are seconds since the epoch, given by the caller: no clock here. GPUs are counted per node; the node agent's
plan still checks the bundles when the reservation's allocation is placed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from contracts.placement import PlacementRequest, PoolAt
from contracts.vocabulary import SlotState
from scheduler.placement import cluster
from scheduler.snapshot import Snapshot
from scheduler.views import SlotView

MAX_SUGGESTIONS = 3


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def overlaps(self, other: Window) -> bool:
        return self.start < other.end and other.start < self.end

    def describe(self) -> str:
        return f"[{_text(self.start)}, {_text(self.end)})"


@dataclass(frozen=True)
class Holding:
    """A running allocation's GPUs on a node, and until when it holds them (None: it has no end)."""

    allocation_id: str
    node: str
    gpus: int
    until: float | None
    preemptible: bool = False


@dataclass(frozen=True)
class Reserved:
    """Another reservation's GPUs on a node in its window."""

    reservation_id: str
    node: str
    gpus: int
    window: Window


@dataclass(frozen=True)
class Admitted:
    node: str
    room: int  # GPUs of the node left in the window once this reservation holds its own


@dataclass(frozen=True)
class Refused:
    message: str
    suggestions: tuple[Window, ...]  # the nearest windows of the same length that would fit


def admit(
    snapshot: Snapshot,
    request: PlacementRequest,
    region: str,
    window: Window,
    holdings: Iterable[Holding],
    reserved: Iterable[Reserved],
) -> Admitted | Refused:
    holdings, reserved = list(holdings), list(reserved)
    nodes = _candidate_nodes(snapshot, request, region)
    if not nodes:
        return Refused(f"no node of {region} could ever hold {request.describe()}", ())
    found = _fit(snapshot, nodes, request.gpu_count, window, holdings, reserved)
    if isinstance(found, Admitted):
        return found
    best_room, best_node = found
    lacks = f"no node has {request.gpu_count} GPUs free in {window.describe()}: the most is {best_room} on {best_node}"
    nearest = tuple(_nearest(snapshot, nodes, request.gpu_count, window, holdings, reserved))
    if nearest:
        lacks += "; the nearest windows that fit: " + ", ".join(w.describe() for w in nearest)
    return Refused(lacks, nearest)


def with_holds(
    snapshot: Snapshot, reserved: Sequence[Reserved], request_ends: float | None, preemptible: bool, own: str | None
) -> Snapshot:
    """The snapshot as a request sees it before the reservations' allocations hold their GPUs: for each reservation
    the request would overlap (it has no end, or ends after the window starts), that many free slots of its node
    count as held, unless the request is preemptible (preempted at the window's start) or is the reservation's own."""
    if preemptible:
        return snapshot
    by_node: dict[str, int] = {}
    for hold in reserved:
        if hold.reservation_id == own or hold.node not in snapshot.nodes:
            continue
        if request_ends is not None and request_ends <= hold.window.start:
            continue
        by_node[hold.node] = by_node.get(hold.node, 0) + hold.gpus
    changed = []
    for name, gpus in by_node.items():
        node = snapshot.nodes[name]
        slots: list[SlotView] = list(node.slots)
        free = [i for i, s in enumerate(slots) if s.state is SlotState.FREE]
        for i in free[:gpus]:
            slots[i] = dataclasses.replace(slots[i], state=SlotState.LEASED, holder="reservation")
        changed.append(dataclasses.replace(node, slots=tuple(slots)))
    return snapshot.with_nodes(changed) if changed else snapshot


@dataclass(frozen=True)
class LatestEnd:
    """The latest an allocation may hold its GPUs until, and why."""

    at: float
    reason: str


def latest_end(
    snapshot: Snapshot, allocation_id: str, holdings: Sequence[Holding], reserved: Sequence[Reserved]
) -> LatestEnd | None:
    """The latest end the reservations of the allocation's node allow it, or None when they allow any: the start of
    the first reservation, starting at or after its current end, that would not find its GPUs free at its start were
    the allocation still holding them then. A preemptible allocation has no such limit (it is preempted at the
    reservation's start), nor one without an end (it was counted as holding when each reservation was admitted).
    The reservation is named by its node and start only: it may be another tenant's."""
    mine = next((h for h in holdings if h.allocation_id == allocation_id), None)
    if mine is None or mine.preemptible or mine.until is None or mine.node not in snapshot.nodes:
        return None
    current = mine.until
    held_on = [dataclasses.replace(h, until=None) if h is mine else h for h in holdings]
    blocking = [
        r
        for r in reserved
        if r.node == mine.node
        and r.window.start >= current
        and _room(snapshot, mine.node, r.window, held_on, [o for o in reserved if o is not r]) < r.gpus
    ]
    if not blocking:
        return None
    first = min(blocking, key=lambda r: r.window.start)
    start = _text(first.window.start)
    return LatestEnd(first.window.start, f"a reservation needs {first.gpus} GPUs of {mine.node} from {start}")


def _candidate_nodes(snapshot: Snapshot, request: PlacementRequest, region: str) -> list[str]:
    """The nodes that could ever take the request, whatever they hold or whoever is live now, in name order."""
    return sorted(node.name for node in cluster.nodes_that_could_hold(snapshot, request, region, now=False))


def _room(snapshot: Snapshot, node: str, window: Window, holdings: list[Holding], reserved: list[Reserved]) -> int:
    total = sum(1 for slot in snapshot.nodes[node].slots if slot.approved and slot.state is not SlotState.QUARANTINED)
    held = sum(
        h.gpus for h in holdings if h.node == node and not h.preemptible and (h.until is None or h.until > window.start)
    )
    promised = sum(r.gpus for r in reserved if r.node == node and r.window.overlaps(window))
    return total - held - promised


def _fit(
    snapshot: Snapshot, nodes: list[str], gpus: int, window: Window, holdings: list[Holding], reserved: list[Reserved]
) -> Admitted | tuple[int, str]:
    """The node left with the least room that holds `gpus` in the window, or the most room any node has."""
    rooms = [(_room(snapshot, node, window, holdings, reserved), node) for node in nodes]
    fitting = [(room - gpus, node) for room, node in rooms if room >= gpus]
    if fitting:
        left, node = min(fitting)
        return Admitted(node, left)
    return min(rooms, key=lambda pair: (-pair[0], pair[1]))


def _nearest(
    snapshot: Snapshot, nodes: list[str], gpus: int, window: Window, holdings: list[Holding], reserved: list[Reserved]
) -> list[Window]:
    """The first windows of the same length, starting when something now in the way ends, that would fit."""
    length = window.end - window.start
    ends = {h.until for h in holdings if h.until is not None and h.until > window.start}
    ends |= {r.window.end for r in reserved if r.window.end > window.start}
    found: list[Window] = []
    for start in sorted(ends):
        candidate = Window(start, start + length)
        if isinstance(_fit(snapshot, nodes, gpus, candidate, holdings, reserved), Admitted):
            found.append(candidate)
            if len(found) == MAX_SUGGESTIONS:
                break
    return found


def _text(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def capacity_at(
    snapshot: Snapshot, at: float, holdings: Iterable[Holding], reserved: Iterable[Reserved]
) -> list[PoolAt]:
    """Every slice and bare-metal pool's GPUs at `at` (a preemptible allocation counts as holding its GPUs: it does
    until something preempts it)."""
    holdings, reserved = list(holdings), list(reserved)
    result = []
    for pool in snapshot.pools:
        if not pool.nodes:
            continue
        held = promised = free = largest = total = 0
        for name in pool.nodes:
            node_total = sum(1 for slot in snapshot.nodes[name].slots if slot.approved)
            node_held = sum(h.gpus for h in holdings if h.node == name and (h.until is None or h.until > at))
            node_promised = sum(r.gpus for r in reserved if r.node == name and r.window.start <= at < r.window.end)
            node_free = max(0, node_total - node_held - node_promised)
            total, held, promised, free = (
                total + node_total,
                held + node_held,
                promised + node_promised,
                free + node_free,
            )
            largest = max(largest, node_free)
        result.append(PoolAt(pool.key, pool.region, pool.gpu_product, total, held, promised, free, largest))
    return result
