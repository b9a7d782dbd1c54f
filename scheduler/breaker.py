"""The node breaker (Nomad's plan-rejection tracker): a node whose attempts keep failing is left out of ranking for
a while, so a host that cannot boot VMs does not take every allocation's first try and its pickup or boot timeout.

Pure: the failures come in as data (when each recent failed attempt on a node ended) and the clock as an argument.
A node trips when `threshold` of its attempts failed within `window`; it then cools off for `cooloff` from its
latest failure in that run. What counts as a failure is the caller's choice (`store.snapshot` leaves out what is
not the node's fault: an operator's retry, a claim conflict with another allocation, a tenant's quota).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from contracts.durations import format_duration


class BreakerPolicy(BaseModel):
    """When a node trips, and for how long it is then left out. `threshold=0` turns the breaker off."""

    model_config = ConfigDict(frozen=True)

    threshold: int = Field(default=3, ge=0, description="Failed attempts within the window that trip a node.")
    window_seconds: PositiveFloat = 300.0
    cooloff_seconds: PositiveFloat = 600.0

    @property
    def lookback(self) -> timedelta:
        """How far back failures can still matter now: a trip's cool-off ends at most this long after its run began."""
        return timedelta(seconds=self.window_seconds + self.cooloff_seconds)


@dataclass(frozen=True, slots=True)
class Cooling:
    """A node left out of ranking until `until`: `failures` attempts failed within `window_seconds`."""

    failures: int
    window_seconds: float
    until: datetime

    def describe(self) -> str:
        return (
            f"cooling off after {self.failures} failed attempts within {format_duration(self.window_seconds)}, "
            f"until {self.until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        )


def cooling_off(failures: Iterable[datetime], policy: BreakerPolicy, now: datetime) -> Cooling | None:
    """Whether a node with these failed attempts is cooling off at `now`, and until when.

    The latest run of `threshold` failures within the window counts (failures before it may extend it: every
    failure within the window of the last one is counted)."""
    if policy.threshold == 0:
        return None
    times = sorted(failures)
    window = timedelta(seconds=policy.window_seconds)
    for last in range(len(times) - 1, policy.threshold - 2, -1):
        if times[last] - times[last - policy.threshold + 1] > window:
            continue
        until = times[last] + timedelta(seconds=policy.cooloff_seconds)
        if until <= now:
            return None  # the latest trip is over; earlier ones ended sooner
        counted = sum(1 for t in times[: last + 1] if times[last] - t <= window)
        return Cooling(failures=counted, window_seconds=policy.window_seconds, until=until)
    return None


def cooling_nodes(
    failures: Mapping[str, Iterable[datetime]], policy: BreakerPolicy, now: datetime
) -> dict[str, Cooling]:
    """node -> its cool-off, for the nodes cooling off at `now`."""
    result: dict[str, Cooling] = {}
    for node, times in failures.items():
        cooling = cooling_off(times, policy, now)
        if cooling is not None:
            result[node] = cooling
    return result
