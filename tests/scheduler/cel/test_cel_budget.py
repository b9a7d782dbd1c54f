"""A request's CEL selectors share one cost budget: the worst selector is refused by its estimate, a
costly request stops at the budget whatever its selectors and devices, and normal requests still place.

The example fleet's slice pools publish two distinct devices (H200 in us-east, L4 in eu-west); a request for GPU
slices meets both, once each however many levels look at them."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.placement import PlacementRequest
from fleet.loader import load_fleet
from scheduler.cel import (
    REQUEST_BUDGET,
    RequestBudget,
    SelectorCostExceeded,
    SelectorRuntimeError,
    admit_selector,
    compile_selector,
    request_budget,
)
from scheduler.cel.cost import MAX_COST
from scheduler.cel.library import REGEX_REFUSED_COST
from scheduler.cel.selector import MAX_COMPILED, MAX_COMPILED_CHARACTERS, Selector, _CompiledCache
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fleet.yaml"
TEN = "[500, 501, 502, 503, 504, 505, 506, 507, 508, 509]"
ISSUE = f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, {TEN}.all(d, a + b + c + d > 0))))"  # within Kubernetes' per-expression limit
NESTED = f"{TEN}.all(a, {TEN}.all(b, a + b > 0))"  # estimated 742, costs 532 per device
H200 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'


def world() -> Snapshot:
    return snapshot_from_fleet(load_fleet([EXAMPLE]))


def test_the_issue_selector_is_refused_at_admission_by_its_estimate() -> None:
    """Four nested 10-element comprehensions passed Kubernetes' estimate limit (1,000,000) and took 15 s per device."""
    assert compile_selector(ISSUE).estimated_cost <= MAX_COST  # what let it through before
    with pytest.raises(SelectorCostExceeded) as refused:
        admit_selector(ISSUE, REQUEST_BUDGET)
    error = refused.value
    assert (error.code, error.estimated, error.expression, error.budget) == (
        "selector_cost_exceeded",
        True,
        ISSUE,
        REQUEST_BUDGET,
    )
    assert error.cost == compile_selector(ISSUE).estimated_cost > REQUEST_BUDGET
    assert str(error).endswith(
        f"is too costly: its estimated cost {error.cost} is over the budget of "
        f"{REQUEST_BUDGET} that a request's selectors may spend together"
    )


def test_an_admitted_selector_that_costs_too_much_over_the_devices_stops_at_the_budget() -> None:
    """Its estimate fits (one device), but a request meets two devices: the pass stops one unit past the budget."""
    compile_selector.cache_clear()  # outcomes another test left (whole ones, charged at once) would overshoot the unit
    assert admit_selector(NESTED, REQUEST_BUDGET).estimated_cost <= REQUEST_BUDGET
    for _ in range(2):  # the second time its outcomes are remembered: the request is charged the same
        with pytest.raises(SelectorCostExceeded) as refused:
            schedule(world(), PlacementRequest(gpu_count=2, selectors=[NESTED]))
        error = refused.value
        assert (error.expression, error.cost, error.budget, error.estimated) == (
            NESTED,
            REQUEST_BUDGET + 1,
            REQUEST_BUDGET,
            False,
        )
        assert str(error).startswith(
            f"the request's CEL selectors cost more than the budget of {REQUEST_BUDGET} that a request's selectors may "
            f"spend together (stopped in '{NESTED}"
        )


def test_a_request_s_selectors_share_one_budget() -> None:
    """Each costs 32 per device; 15 of them over two devices fit (960), 32 do not, though each alone is cheap."""
    selectors = [f"{TEN}.all(x, x > {n})" for n in range(32)]
    budget = RequestBudget()
    placed = schedule(world(), PlacementRequest(gpu_count=2, selectors=selectors[:15]), budget=budget)
    assert placed.placed
    assert budget.spent == 15 * 32 * 2  # the region and cluster levels both look at the chosen region's device: once
    with pytest.raises(SelectorCostExceeded) as refused:
        schedule(world(), PlacementRequest(gpu_count=2, selectors=selectors))
    assert refused.value.cost == REQUEST_BUDGET + 1


def test_a_normal_selector_still_places_and_costs_a_few_units() -> None:
    budget = RequestBudget()
    result = schedule(world(), PlacementRequest(gpu_count=2, selectors=[H200]), budget=budget)
    assert result.placed and result.region == "us-east"
    assert 0 < budget.spent <= 20  # 7 units per device


@pytest.mark.parametrize(
    ("name", "expression"),
    [
        # `a + a` copies the list: 2**24 elements for 30 units before (cel-go concatenates lazily)
        ("list doubling", "size(a24) > 0"),
        # a list nesting itself 24 times compares 2**24 elements for a few units
        ("self-nesting equality", "a24 == a24"),
        # and `%s` wrote all of them
        ("self-nesting formatted", '"%s".format([a24]).size() > 0'),
    ],
)
def test_what_cel_python_copies_or_walks_is_charged_and_stopped(name: str, expression: str) -> None:
    step = (lambda n: f"a{n - 1} + a{n - 1}") if name == "list doubling" else (lambda n: f"[a{n - 1}, a{n - 1}]")
    text = expression
    for level in range(24, 0, -1):
        text = f"cel.bind(a{level}, {step(level)}, {text})"
    text = f"cel.bind(a0, [1, 2], {text})"
    admit_selector(text, REQUEST_BUDGET)  # the estimate cannot see it coming
    with request_budget() as budget, pytest.raises(SelectorCostExceeded):
        compile_selector(text).matches({"name": "g", "driver": "gpu.nvidia.com", "attributes": {}, "capacity": {}})
    assert REQUEST_BUDGET < budget.spent <= 2 * REQUEST_BUDGET  # charged before the copy or the walk


def test_the_compiled_selector_cache_is_bounded_in_entries_and_in_text() -> None:
    """Keyed by text, it is defeated by changing a constant: it must not grow with what tenants send."""
    cache = _CompiledCache(entries=3, characters=100)
    for n in range(5):
        cache.put(Selector(f"{n} == {n}", tree=None))  # type: ignore[arg-type]
    assert len(cache) == 3 and cache.get("0 == 0") is None and cache.get("4 == 4") is not None
    assert cache.get("2 == 2") is not None  # used: now the most recent
    cache.put(Selector("5 == 5", tree=None))  # type: ignore[arg-type]
    assert cache.get("3 == 3") is None and cache.get("2 == 2") is not None
    long = Selector("x" * 60, tree=None)  # type: ignore[arg-type]
    cache.put(long)
    cache.put(Selector("y" * 60, tree=None))  # type: ignore[arg-type]
    assert cache.held_characters <= 100 and cache.get(long.expression) is None
    assert (MAX_COMPILED, MAX_COMPILED_CHARACTERS) == (4096, 1 << 20)


def test_the_process_wide_cache_shares_one_selector_per_text() -> None:
    text = 'device.driver == "bounded.example.com"'
    assert compile_selector(text) is compile_selector(text)


DEVICE = {"name": "g", "driver": "gpu.nvidia.com", "attributes": {}, "capacity": {}}


def test_parsing_a_long_literal_is_charged_its_length() -> None:
    """`isQuantity` of a 4,000-digit literal took milliseconds for one unit; it costs its traversal now."""
    with request_budget() as budget:
        assert compile_selector('isQuantity("' + "1" * 4000 + '") || true').matches(DEVICE) is True
    assert budget.spent == 1 + 400 + 1  # the call, ceil(0.1 x 4,000) characters read, the `||`


def test_a_regex_past_re2_s_memory_bound_is_a_runtime_error_at_a_fixed_cost() -> None:
    """`\\pL{1000}` compiled into megabytes of program, about 100 ms each time; now RE2 refuses it early."""
    with request_budget() as budget, pytest.raises(SelectorRuntimeError) as failed:
        compile_selector('"a".matches("\\\\pL{1000}")').matches(DEVICE)
    assert failed.value.reason.startswith("match error")
    assert REGEX_REFUSED_COST < budget.spent < REGEX_REFUSED_COST + 10
