"""`berth reservations create|list|cancel` and `berth capacity --at` against the API served over the lab fleet,
as a person types them: the reservation made and listed, the capacity it takes in its window, a full
window refused in one line naming the nearest window that fits, bad input refused without a traceback."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.cli.test_cli_api import Terminal, one_error_line, terminal  # noqa: F401  (the fixture)


def _in(hours: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(microsecond=0).isoformat()


def test_a_reservation_is_made_listed_seen_in_the_capacity_then_and_cancelled(terminal: Terminal) -> None:  # noqa: F811
    made = terminal.ok(
        "reservations",
        "create",
        "--gpus",
        "4",
        "--region",
        "lab",
        "--pool",
        "lab-1/slices",
        "--start",
        _in(2),
        "--duration",
        "1h",
    )
    assert made.startswith("Reservation ") and " on big: 4 GPUs from " in made  # `big` is the only 4-GPU node
    reservation = made.split()[1]
    listed = terminal.json("reservations", "list")["reservations"]
    assert [(r["id"], r["state"], r["node"]) for r in listed] == [(reservation, "reserved", "big")]
    assert reservation in terminal.ok("reservations", "list")

    # In its window the pool's 4 GPUs of `big` are promised; now they are free.
    during = {p["pool"]: p for p in terminal.json("capacity", "--at", _in(2.5))["pools"]}
    assert (during["lab-1/slices"]["reserved"], during["lab-1/slices"]["largest_free"]) == (4, 2)
    now = {p["pool"]: p for p in terminal.json("capacity", "--at", _in(0))["pools"]}
    assert now["lab-1/slices"]["reserved"] == 0
    assert "RESERVED" in terminal.ok("capacity", "--at", _in(2.5))

    # The same window again: no node has 4 GPUs then; the nearest window that fits starts at its end.
    full = terminal.berth(
        "reservations", "create", "--gpus", "4", "--region", "lab", "--start", _in(2), "--duration", "1h"
    )
    line = one_error_line(full)
    assert "no node has 4 GPUs free in [" in line and "the nearest windows that fit: [" in line
    assert "(window_full, HTTP 409)" in line

    assert f"Cancelling reservation {reservation}" in terminal.ok("reservations", "cancel", reservation)
    # A cancel is accepted (202) and recorded by the reservation's workflow: once it reads cancelled, a second is
    # refused (before that, a second is accepted too, as a repeat of the first).
    deadline = time.monotonic() + 20
    while [r["state"] for r in terminal.json("reservations", "list")["reservations"] if r["id"] == reservation] != [
        "cancelled"
    ]:
        assert time.monotonic() < deadline, f"reservation {reservation} was never cancelled"
        time.sleep(0.1)
    again = terminal.berth("reservations", "cancel", reservation)
    assert "(invalid_state, HTTP 409)" in one_error_line(again) or "cannot be cancelled" in again.stderr


def test_bad_reservation_input_is_refused_in_one_line(terminal: Terminal) -> None:  # noqa: F811
    base = ["reservations", "create", "--gpus", "2", "--region", "lab"]
    past = terminal.berth(*base, "--start", _in(-1), "--duration", "1h")
    assert "is not in the future" in one_error_line(past)
    both = terminal.berth(*base, "--start", _in(1), "--duration", "1h", "--end", _in(3))
    assert "give exactly one of ends_at and duration" in one_error_line(both)
    neither = terminal.berth(*base, "--start", _in(1))
    assert "give exactly one of ends_at and duration" in one_error_line(neither)
    nowhere = terminal.berth(
        "reservations", "create", "--gpus", "2", "--region", "mars", "--start", _in(1), "--duration", "1h"
    )
    assert "region 'mars' does not exist" in one_error_line(nowhere)
    no_pool = terminal.berth(*base, "--pool", "lab-1/gpus", "--start", _in(1), "--duration", "1h")
    assert "region 'lab' has no pool 'lab-1/gpus' (pools: lab-1/" in one_error_line(no_pool)
    assert terminal.json("reservations", "list")["reservations"] == []
