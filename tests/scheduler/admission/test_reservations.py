"""Reservations' admission, in hand-built fleets: a window is admitted only where a node can hold
it then, counting running allocations that still hold their GPUs at its start (a preemptible one does not: it is
preempted then) and every overlapping reservation; a refusal says what the window lacks and the nearest windows that
fit. Before its allocation holds them, a reservation's GPUs are held from every request that would overlap it."""

from __future__ import annotations

from contracts.placement import PlacementRequest
from contracts.vocabulary import SlotState
from scheduler.admission.reservations import Admitted, Holding, Refused, Reserved, Window, admit, with_holds
from tests.scheduler.admission.test_queueing import Pool, world

TWO_NODES: list[Pool] = [("h100", "H100", 8, 2, "a")]
HOUR = 3600.0
T0 = 1_800_000_000.0  # a Monday, 09:00 is as good as any instant
WINDOW = Window(T0 + 24 * HOUR, T0 + 72 * HOUR)  # tomorrow, for 48 hours


def asked(gpus: int) -> PlacementRequest:
    return PlacementRequest(gpu_count=gpus, tenant="a")


def test_a_window_is_admitted_on_the_node_left_with_the_least_room() -> None:
    fleet = world(TWO_NODES, ("b", "a01", 4))
    # a01 holds 4 GPUs with no end: 4 left in the window; a02 has 8. Binpack: a01 for 4 GPUs, a02 for 6.
    running = [Holding("held-0", "a01", 4, None)]
    assert admit(fleet, asked(4), "r1", WINDOW, running, []) == Admitted("a01", 0)
    assert admit(fleet, asked(6), "r1", WINDOW, running, []) == Admitted("a02", 2)


def test_allocations_ending_before_the_window_and_preemptible_ones_do_not_count() -> None:
    fleet = world(TWO_NODES, ("b", "a01", 8), ("b", "a02", 8))
    running = [
        Holding("ends-before", "a01", 8, until=WINDOW.start - 1),
        Holding("spot", "a02", 8, until=None, preemptible=True),
    ]
    assert isinstance(admit(fleet, asked(8), "r1", WINDOW, running, []), Admitted)


def test_a_full_window_is_refused_with_what_it_lacks_and_the_nearest_windows_that_fit() -> None:
    fleet = world(TWO_NODES, ("b", "a01", 8), ("b", "a02", 8))
    running = [
        Holding("forever", "a01", 8, until=None),
        Holding("ends-later", "a02", 8, until=WINDOW.start + 10 * HOUR),
    ]
    other = Reserved("r-other", "a02", 8, Window(WINDOW.start + 10 * HOUR, WINDOW.start + 20 * HOUR))
    refused = admit(fleet, asked(8), "r1", WINDOW, running, [other])
    assert isinstance(refused, Refused)
    assert refused.message.startswith("no node has 8 GPUs free in [")
    # a02 frees at +10h, but the other reservation takes it until +20h: the nearest 48-hour window starts then.
    nearest = Window(WINDOW.start + 20 * HOUR, WINDOW.start + 68 * HOUR)
    assert refused.suggestions == (nearest,)
    assert refused.message.endswith(f"the most is 0 on a01; the nearest windows that fit: {nearest.describe()}")


def test_overlapping_reservations_share_a_node_only_as_far_as_it_has_room() -> None:
    fleet = world(TWO_NODES)
    first = Reserved("r-1", "a01", 6, WINDOW)
    second = admit(fleet, asked(4), "r1", WINDOW, [], [first])
    assert second == Admitted("a02", 4)  # 2 left on a01: too few; a02 has 8
    later = Window(WINDOW.end, WINDOW.end + HOUR)  # after the first one's window: a01 is whole again
    assert admit(fleet, asked(8), "r1", later, [], [first]) == Admitted("a01", 0)


def test_before_its_allocation_holds_them_a_reservations_gpus_are_held_from_overlapping_requests() -> None:
    fleet = world(TWO_NODES)
    hold = [Reserved("r-1", "a01", 6, WINDOW)]

    def free(snapshot: object) -> int:
        return sum(1 for s in snapshot.nodes["a01"].slots if s.state is SlotState.FREE)  # type: ignore[attr-defined]

    assert free(with_holds(fleet, hold, request_ends=None, preemptible=False, own=None)) == 2  # no end: overlaps
    assert free(with_holds(fleet, hold, request_ends=WINDOW.start + 1, preemptible=False, own=None)) == 2
    assert free(with_holds(fleet, hold, request_ends=WINDOW.start, preemptible=False, own=None)) == 8  # ends before
    assert free(with_holds(fleet, hold, request_ends=None, preemptible=True, own=None)) == 8  # preempted at start
    assert free(with_holds(fleet, hold, request_ends=None, preemptible=False, own="r-1")) == 8  # its own allocation
