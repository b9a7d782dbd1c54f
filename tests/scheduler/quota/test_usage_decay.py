"""Fair share that remembers: decayed GPU-seconds order a fair-sharing tree whose root sets `usageHalfLife`, as
Slurm's fair-share factor and Kueue's admission fair sharing do."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scheduler.admission.admit import ordered
from scheduler.quota.usage_decay import ENTRY_PENALTY_SECONDS, Held, contribution, decayed, half_lives
from scheduler.snapshot import Snapshot
from tests.scheduler.admission.test_queueing import ONE_H100_NODE, Tenant, queued, run, world

DAY = 86400.0
NOW = 1_800_000_000.0  # an instant, in seconds since the epoch
REMEMBERS = {"lab": "{gpuQuota: 8, fairSharing: {enabled: true, usageHalfLife: 24h}}"}


def with_usage(snapshot: Snapshot, used: dict[str, float]) -> Snapshot:
    """The snapshot as the admission pass gives it to the scheduler: each tenant's decayed usage on its view."""
    lives = half_lives(snapshot.tenants, snapshot.cohorts)
    return snapshot.with_tenants(
        dataclasses.replace(view, decayed_usage=used.get(name, 0.0)) if name in lives else view
        for name, view in snapshot.tenants.items()
    )


def test_a_worked_example_orders_the_queue_as_slurms_fair_share_factor_does() -> None:
    """Three tenants of one cohort, half-life one day, weights (Slurm's shares) 1, 1 and 2:

        a: 8 GPUs for 10 h, ended 2 days ago       raw 288,000 GPU-s
        b: 2 GPUs for 12 h, ended 2 hours ago      raw  86,400 GPU-s
        c: 4 GPUs for 24 h, ended 6 days ago       raw 345,600 GPU-s

    Decayed usage of g GPUs over [s, e] is g * H / ln 2 * (2^(-(now - e)/H) - 2^(-(now - s)/H)). Slurm's classic
    factor is F = 2^(-U/S), U a tenant's part of all decayed usage and S its part of the shares; the highest F goes
    first. c, who used most in raw GPU-seconds but long ago and with twice the weight, goes first; b, who used least
    but most recently, last. By shares of what each holds now (nothing), b would go before a."""
    history = {
        "a": Held(8, NOW - 2 * DAY - 10 * 3600, NOW - 2 * DAY),
        "b": Held(2, NOW - 14 * 3600, NOW - 2 * 3600),
        "c": Held(4, NOW - 7 * DAY, NOW - 6 * DAY),
    }
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}

    def by_hand(g: int, s: float, e: float) -> float:
        return g * DAY / math.log(2) * (2 ** (-(NOW - e) / DAY) - 2 ** (-(NOW - s) / DAY))

    used = {name: decayed(0.0, None, [held], NOW, DAY) for name, held in history.items()}
    for name, held in history.items():
        assert used[name] == pytest.approx(by_hand(held.gpus, held.start, held.end or NOW), rel=1e-12)
    assert used == pytest.approx({"a": 62_535.4, "b": 68_919.4, "c": 3_895.3}, abs=0.1)

    total_u, total_s = sum(used.values()), sum(weights.values())
    factor = {t: 2 ** (-(used[t] / total_u) / (weights[t] / total_s)) for t in weights}
    slurm_order = sorted(weights, key=lambda t: -factor[t])
    assert slurm_order == ["c", "a", "b"]

    tenants: dict[str, Tenant] = {t: (0, w, "lab") for t, w in weights.items()}
    fleet = with_usage(world(ONE_H100_NODE, tenants=tenants, cohorts=REMEMBERS), used)
    queue = [queued("b-1", "b", 1, 1), queued("a-1", "a", 2, 1), queued("c-1", "c", 3, 1)]  # arrival: b, a, c
    assert [request.tenant for request, _ in ordered(queue, fleet, {})] == slurm_order
    shown = {request.tenant: standing.usage for request, standing in ordered(queue, fleet, {})}
    assert shown == pytest.approx(used)

    instantaneous = world(
        ONE_H100_NODE, tenants=tenants, cohorts={"lab": "{gpuQuota: 8, fairSharing: {enabled: true}}"}
    )
    # By shares of what each would hold with its request (each holds nothing now): c's weight, then arrival.
    assert [request.tenant for request, _ in ordered(queue, instantaneous, {})] == ["c", "b", "a"]


def test_a_request_admitted_in_a_pass_charges_its_tenant_an_entry_penalty() -> None:
    """Kueue's entry penalty: what was admitted has used nothing yet, so without it the tenant with the lowest
    usage would take every request of the pass. b used less than one penalty's worth more than a: they alternate."""
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab")}
    fleet = with_usage(world(ONE_H100_NODE, tenants=tenants, cohorts=REMEMBERS), {"a": 0.0, "b": 200.0})
    queue = [queued(f"a-{i}", "a", i, 1) for i in (1, 2)] + [queued(f"b-{i}", "b", 2 + i, 1) for i in (1, 2)]
    result = run(fleet, queue)
    assert [v.allocation_id for v in result.admitted] == ["a-1", "b-1", "a-2", "b-2"]
    assert [v.usage for v in result.admitted] == [0.0, 200.0, ENTRY_PENALTY_SECONDS, 200.0 + ENTRY_PENALTY_SECONDS]


def test_decayed_usage_carried_forward_equals_usage_summed_from_the_whole_history() -> None:
    """The pass keeps a carried sum and adds only the intervals since: the same number as summing everything."""
    day = DAY
    history = [Held(4, NOW - 3 * day, NOW - 2 * day), Held(1, NOW - 30 * 3600, None), Held(2, NOW - 3600, NOW - 60)]
    as_of = NOW - day
    carried = decayed(0.0, None, history, as_of, day)
    assert decayed(carried, as_of, history, NOW, day) == pytest.approx(decayed(0.0, None, history, NOW, day))
    # One GPU-second a half-life ago counts half a GPU-second now.
    assert contribution(Held(1, NOW - day - 0.5, NOW - day + 0.5), NOW, day) == pytest.approx(0.5, rel=1e-6)
    # A tree without usageHalfLife orders by shares: its tenants get no decayed usage at all.
    fleet = world(ONE_H100_NODE, tenants={"a": (0, 1, "lab")}, cohorts={"lab": "{fairSharing: {enabled: true}}"})
    assert half_lives(fleet.tenants, fleet.cohorts) == {}
