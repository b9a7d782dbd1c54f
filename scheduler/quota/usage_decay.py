"""Usage that remembers: GPU-seconds decayed with a half-life, for fair sharing (`fairSharing.usageHalfLife`).

A GPU held at instant t counts, at instant `now`, 2^(-(now - t) / halfLife) of a GPU-second per second: what a tenant
used one half-life ago counts half, as in Slurm's fair share (`PriorityDecayHalfLife`) and Kueue's admission fair
sharing (`usageHalfLifeTime`). An interval of g GPUs from s to e therefore contributes exactly

    g * halfLife / ln 2 * (2^(-(now - e) / halfLife) - 2^(-(now - s) / halfLife))

and a sum known at `as_of` carries forward as value * 2^(-(now - as_of) / halfLife): decayed usage at any instant
is a carried sum plus the intervals since, which keeps the admission pass's cost independent of the ledger's age.

Kueue compares LocalQueues by this usage over their weight, lowest first; Slurm's classic factor 2^(-U/S) (U the
tenant's share of all decayed usage, S its share of the weights) orders tenants the same way. A request admitted
in a pass has used nothing yet, so the pass charges its tenant an entry penalty (Kueue's, worth one sampling
interval of the request's GPUs) for the rest of the pass: one tenant's low usage does not win it every request.

The store sums the same formula in PostgreSQL (store/usage.py), one row per tenant; `decayed` here is its reference,
which the tests hold the store's sums to.

Pure: instants are seconds since the epoch, passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.quota.cohorts import root_of
from scheduler.views import CohortView, TenantView

# Kueue's default usageSamplingInterval (5 minutes): an admitted request counts this many seconds of its GPUs at once.
ENTRY_PENALTY_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Held:
    """GPUs held from `start` to `end` (None: still held), in seconds since the epoch."""

    gpus: int
    start: float
    end: float | None = None


def weight_at(age: float, half_life: float) -> float:
    """How much a GPU-second `age` seconds old counts now."""
    return math.exp(-math.log(2) * age / half_life)


def contribution(held: Held, now: float, half_life: float, since: float | None = None) -> float:
    """The interval's decayed GPU-seconds at `now`, counting only from `since` (a carried sum's instant) on."""
    start = held.start if since is None else max(held.start, since)
    end = now if held.end is None else min(held.end, now)
    if end <= start:
        return 0.0
    return held.gpus * half_life / math.log(2) * (weight_at(now - end, half_life) - weight_at(now - start, half_life))


def decayed(carried: float, as_of: float | None, intervals: Iterable[Held], now: float, half_life: float) -> float:
    """Decayed GPU-seconds at `now`: `carried` (the sum at `as_of`; None: nothing carried) decayed since, plus each
    interval's part after `as_of`."""
    value = carried * weight_at(now - as_of, half_life) if as_of is not None else 0.0
    return value + sum(contribution(h, now, half_life, since=as_of) for h in intervals)


def half_lives(tenants: Mapping[str, TenantView], cohorts: Mapping[str, CohortView]) -> dict[str, float]:
    """Each tenant whose cohort tree orders by decayed usage, with its root's half-life (in seconds)."""
    found: dict[str, float] = {}
    for name, view in tenants.items():
        root = root_of(view.cohort, cohorts)
        cohort = cohorts.get(root) if root is not None else None
        if cohort is not None and cohort.fair_sharing and cohort.usage_half_life is not None:
            found[name] = cohort.usage_half_life
    return found


__all__ = ["ENTRY_PENALTY_SECONDS", "Held", "contribution", "decayed", "half_lives", "weight_at"]
