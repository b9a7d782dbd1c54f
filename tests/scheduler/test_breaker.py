"""The node breaker: when repeated failed attempts cool a node off, and how placement, explain and capacity show it.
Pure: failures and the clock are arguments."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from fleet.errors import FleetError
from fleet.loader import parse_fleet
from scheduler.breaker import BreakerPolicy, Cooling, cooling_nodes, cooling_off
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement.capacity import capacity
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot
from tests.workflows.allocation.test_deadlines_breakers import with_pool_deadlines
from tests.workflows.lab import lab_fleet

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(threshold=3, window_seconds=300, cooloff_seconds=600)


def at(*minutes: float) -> list[datetime]:
    return [T0 + timedelta(minutes=m) for m in minutes]


def test_three_failures_within_the_window_cool_the_node_off_from_the_last_one() -> None:
    cooling = cooling_off(at(0, 2, 4), POLICY, now=T0 + timedelta(minutes=5))
    assert cooling == Cooling(failures=3, window_seconds=300, until=T0 + timedelta(minutes=14))
    assert cooling.describe() == "cooling off after 3 failed attempts within 5m0s, until 2026-03-01T12:14:00Z"


@pytest.mark.parametrize(
    ("failures", "now_minute"),
    [
        pytest.param(at(0, 2), 3, id="two failures are not enough"),
        pytest.param(at(0, 3, 6), 7, id="three spread over more than the window"),
        pytest.param(at(0, 2, 4), 14, id="the cool-off is over"),
        pytest.param([], 0, id="no failures"),
    ],
)
def test_no_cool_off(failures: list[datetime], now_minute: float) -> None:
    assert cooling_off(failures, POLICY, now=T0 + timedelta(minutes=now_minute)) is None


def test_every_failure_within_the_window_is_counted_and_a_later_run_extends_the_cool_off() -> None:
    cooling = cooling_off(at(8, 0, 1, 6, 7), POLICY, now=T0 + timedelta(minutes=9))  # unsorted on purpose
    assert cooling is not None and cooling.failures == 3 and cooling.until == T0 + timedelta(minutes=18)
    assert cooling_off(at(0, 1, 2, 3), POLICY, now=T0 + timedelta(minutes=4)).failures == 4


def test_a_threshold_of_zero_turns_the_breaker_off() -> None:
    assert cooling_off(at(0, 0, 0, 0), BreakerPolicy(threshold=0), now=T0) is None


def test_cooling_nodes_keeps_only_the_nodes_cooling_now() -> None:
    failures = {"hot": at(0, 1, 2), "warm": at(0, 1), "cooled": at(-30, -29, -28)}
    assert set(cooling_nodes(failures, POLICY, now=T0 + timedelta(minutes=3))) == {"hot"}


def fleet_text(deadlines: dict[str, object] | None = None) -> str:
    hosts = {name: {"gpus": 4} for name in ("n-01", "n-02", "n-03")}
    deadlines = {"provisioning": "15m", "waitingReady": "1h30m", "claiming": 90} if deadlines is None else deadlines
    return with_pool_deadlines(lab_fleet(hosts), deadlines)


def cooled(*names: str) -> Snapshot:
    snapshot = snapshot_from_fleet(parse_fleet([("f.yaml", fleet_text())]))
    cooling = Cooling(failures=3, window_seconds=300, until=T0 + timedelta(minutes=14))
    return snapshot.with_nodes(dataclasses.replace(snapshot.nodes[name], cooling_off=cooling) for name in names)


def test_a_node_cooling_off_is_not_ranked_and_explain_names_its_failures_and_when_it_ends() -> None:
    result = schedule(cooled("n-01"), PlacementRequest(gpu_count=2, tenant="acme"), detail=True)
    assert result.placed and [c.node for c in result.candidates] == ["n-02", "n-03"]
    node_level = next(level for level in result.explanation.levels if level.level == "node")
    assert node_level.dropped == {Reason.NODE_COOLING_OFF: 1}
    assert node_level.summary == ("2/3 nodes can take 2 GPU slices: 1 is cooling off after repeated failed attempts")
    (item,) = [item for item in node_level.items or [] if item.name == "n-01"]
    assert "cooling off after 3 failed attempts within 5m0s, until 2026-03-01T12:14:00Z" in (item.detail or "")


def test_when_every_node_cools_off_the_request_waits_for_capacity_rather_than_hardware() -> None:
    result = schedule(cooled("n-01", "n-02", "n-03"), PlacementRequest(gpu_count=2, tenant="acme"))
    assert result.refusal is not None and result.refusal.code is Reason.INSUFFICIENT_CAPACITY


def test_capacity_counts_no_slices_on_a_node_cooling_off() -> None:
    (pool,) = capacity(cooled("n-01"))
    assert pool.cooling_off == 1 and pool.ready_nodes == 3
    assert pool.slices[4] == 2  # n-02 and n-03 only


def test_pool_deadlines_are_read_from_the_fleet_file_in_seconds() -> None:
    (pool,) = cooled().pools
    assert pool.deadlines == {"claiming": 90.0, "provisioning": 900.0, "waiting_ready": 5400.0}


@pytest.mark.parametrize(
    ("deadlines", "message"),
    [
        ({"provisioning": "15 minutes"}, "is not a duration"),
        ({"provisioning": "0s"}, "greater than 0"),
        ({"booting": "5m"}, "booting"),
    ],
)
def test_a_bad_deadline_is_refused_with_the_field(deadlines: dict[str, object], message: str) -> None:
    with pytest.raises(FleetError, match=message):
        parse_fleet([("f.yaml", fleet_text(deadlines))])
