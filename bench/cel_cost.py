"""How fast Berth's CEL evaluator spends cost units, the request budget that follows, and the worst selector before and
after the budget. `python -m bench.cel_cost [--target-ms 60] [--repeat 5]`.

Speed: each selector shape below is evaluated against one published device with only Kubernetes' per-expression
limit (no request budget), `--repeat` times; CPU time is this thread's (`time.thread_time`), the figure per shape is
the median. The budget is the slowest shape's units per millisecond times `--target-ms`: the CPU one request's
selectors may spend together at that speed.

`--speed-only` prints the speed table and one evaluation of each worst selector with nothing newer than the
evaluator's API, so the same figures can be taken of an older tree (the figures before the request budget):

    git archive 1714591 scheduler | tar -x -C /tmp/before && cd /tmp/before && \
        PYTHONPATH=/path/to/berth python -m bench.cel_cost --speed-only

Worst selector: the costliest selectors a tenant could send, run as explain runs them (`scheduler.placement.schedule.schedule`
over a snapshot whose pools publish `DEVICES` distinct devices, 32 selectors in one request) with the old rules (every
selector admitted whose estimate is at most 1,000,000, each (selector, device) evaluation stopped at 1,000,000, no
request budget) and with the new ones (admission by estimate against the budget, then the request budget).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from celpy.evaluation import CELEvalError

from scheduler import cel
from scheduler.cel import cost
from scheduler.cel.device import prepare_device
from scheduler.cel.evaluator import evaluate
from scheduler.cel.selector import compile_selector

DEVICE = {
    "name": "gpu-0",
    "driver": "gpu.nvidia.com",
    "attributes": {
        "productName": {"string": "H200"},
        "cudaMajor": {"int": 12},
        "driverVersion": {"version": "550.54.15"},
    },
    "capacity": {"memory": {"value": "141Gi"}},
}
TEN = "[500, 501, 502, 503, 504, 505, 506, 507, 508, 509]"


def _bound(depth: int, body: str, step: Callable[[int], str]) -> str:
    """`cel.bind(a1, <step 1>, cel.bind(a2, <step 2>, ... body))` over `a0 = [1, 2]`."""
    expression = body
    for level in range(depth, 0, -1):
        expression = f"cel.bind(a{level}, {step(level)}, {expression})"
    return f"cel.bind(a0, [1, 2], {expression})"


SHAPES: dict[str, str] = {
    "typical (attribute and capacity)": 'device.attributes["gpu.nvidia.com"].productName == "H200" && '
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("141Gi")) >= 0',
    "one comparison": 'device.driver == "gpu.nvidia.com"',
    "semver": 'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("535.0.0"))',
    "comprehension, 10": f"{TEN}.all(x, x > 0)",
    "comprehension with arithmetic, 10": f"{TEN}.all(x, x + 1 > 0)",
    "nested comprehensions, 10 x 10": f"{TEN}.all(a, {TEN}.all(b, a + b > 0))",
    "three nested, 10 x 10 x 10": f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, a + b + c > 0)))",
    "map and filter, 10": f"{TEN}.map(x, x * 2).filter(x, x % 3 == 0).size() >= 0",
    "strings (split, join, contains)": '"a,b,c,d,e,f,g,h".split(",").join("-").contains("d-e")',
    "string format": '"%s has %d GPUs at %.2f".format(["node", 8, 1.5]).size() > 0',
    "regex": 'device.driver.matches("^gpu\\\\.[a-z]+\\\\.com$")',
    "regex, 2,000-instruction program": '"a".matches("[a-z]{1000}[a-z]{1000}")',
    "regex past RE2's memory bound": '"a".matches("\\\\pL{1000}")',
    "parsing a 4,000-digit literal": 'isQuantity("' + "1" * 4000 + '")',
    "list doubling, 12 levels": _bound(12, "size(a12) > 0", lambda n: f"a{n - 1} + a{n - 1}"),
    "self-nesting equality, 8 levels": _bound(8, "a8 == a8", lambda n: f"[a{n - 1}, a{n - 1}]"),
}

# The worst selectors: the one that stalled explain for 15 s before the budget (four nested comprehensions, estimate
# under the old limit of 1,000,000) and, under the new rules, the slowest shape whose estimate fits the budget (two
# nested 10-element comprehensions).
WORST = {
    "the stall's: four nested 10-element all()": f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, {TEN}.all(d, a + b + c + d > 0))))",
    "worst admitted now: two nested 10-element all()": f"{TEN}.all(a, {TEN}.all(b, a + b > 0))",
}
DEVICES = 4  # distinct devices the request meets (say four InferenceClasses in its region)
SELECTORS = 32  # the most a request may carry; each a distinct text (a changed constant defeats every cache)


def speed(expression: str, repeat: int) -> tuple[int, float]:
    """(cost units of one evaluation, median CPU ms of one evaluation), with Kubernetes' per-expression limit only."""
    tree = compile_selector(expression)._tree
    device = prepare_device(DEVICE).value
    times: list[float] = []
    units = 0
    for _ in range(repeat):
        start = time.thread_time()
        with cost.tracking(cost.MAX_COST) as tracker:
            try:
                evaluate(tree, {"device": device})
            except CELEvalError:  # an error is an outcome too (the regex past RE2's bound): its cost is what counts
                pass
        times.append(1000 * (time.thread_time() - start))
        units = tracker.spent
    return units, statistics.median(times)


def _copies(expression: str) -> list[str]:
    return [f"({expression}) || {copy} == -1" for copy in range(SELECTORS)]


def _devices() -> list[dict[str, object]]:
    attributes = DEVICE["attributes"]
    assert isinstance(attributes, dict)
    return [{**DEVICE, "name": f"gpu-{n}", "attributes": {**attributes, "index": {"int": n}}} for n in range(DEVICES)]


def before(expression: str) -> tuple[float, int]:
    """Old rules (admitted if its estimate is at most 1,000,000, each evaluation stopped at 1,000,000 alone, no
    request budget): (CPU ms, cost units) of the whole request, from one evaluation's figures times SELECTORS x
    DEVICES (every (selector, device) pair is distinct, so each is evaluated; measuring them all would take minutes)."""
    units, ms = speed(_copies(expression)[0], 1)
    return ms * SELECTORS * DEVICES, min(units, cost.MAX_COST) * SELECTORS * DEVICES


def after(expression: str) -> tuple[float, float, int, str]:
    """New rules, measured in full: (admission CPU ms, evaluation CPU ms, cost units charged, verdict) of the request
    as explain runs its selectors: each compiled and admitted by its estimate, then one request budget over every
    selector and device. Admission is mostly parsing the 32 distinct texts (it ran in the old rules too)."""
    start = time.thread_time()
    texts = _copies(expression)
    try:
        for text in texts:
            cel.admit_selector(text, cost.REQUEST_BUDGET)
    except cel.SelectorCostExceeded as error:
        return (
            1000 * (time.thread_time() - start),
            0.0,
            0,
            f"422 at admission: estimate {error.cost:,} > {error.budget}",
        )
    admitted = time.thread_time()
    with cost.request_budget() as budget:
        try:
            for text in texts:
                selector = cel.compile_selector(text)
                for device in _devices():
                    try:
                        selector.matches(device)
                    except cel.SelectorRuntimeError:
                        pass
            verdict = "within the budget"
        except cel.SelectorCostExceeded as error:
            verdict = f"refused at run time at {error.cost:,} units (budget {error.budget:,})"
    done = time.thread_time()
    return 1000 * (admitted - start), 1000 * (done - admitted), budget.spent, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-ms", type=float, default=60.0, help="CPU a request's selectors may spend in all")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--speed-only",
        action="store_true",
        help="only the speed table and one evaluation of each worst selector (runs on an older scheduler/ too)",
    )
    args = parser.parse_args()

    print("| selector shape | cost units | CPU ms | units per ms |")
    print("| --- | ---: | ---: | ---: |")
    speeds = []
    for name, expression in SHAPES.items():
        units, ms = speed(expression, args.repeat)
        speeds.append(units / ms)
        print(f"| {name} | {units:,} | {ms:.3f} | {units / ms:.1f} |")
    slowest = min(speeds)
    print(f"\nslowest: {slowest:.1f} units/ms; median of shapes: {statistics.median(speeds):.1f} units/ms")
    budget = getattr(cost, "REQUEST_BUDGET", None)  # absent from a tree older than the request budget
    print(f"budget for {args.target_ms:g} ms at the slowest speed: {slowest * args.target_ms:.0f} units")
    if budget is not None:
        print(
            f"REQUEST_BUDGET is {budget}: {budget / slowest:.1f} ms at the slowest speed, "
            f"{budget / statistics.median(speeds):.1f} at the median shape's"
        )

    print("\none evaluation of each worst selector on one device:")
    for name, expression in WORST.items():
        units, ms = speed(expression, 1)
        print(f"- {name}: {units:,} units, {ms:,.1f} ms CPU")
    if args.speed_only:
        return

    print(f"\nworst requests ({SELECTORS} selectors, {DEVICES} distinct devices):")
    print(
        "| selector | estimate | before: evaluation CPU ms | before: units | after: admission CPU ms "
        "| after: evaluation CPU ms | after: units charged | after |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, expression in WORST.items():
        estimate = cel.compile_selector(expression).estimated_cost
        before_ms, before_units = before(expression)
        cel.compile_selector.cache_clear()  # type: ignore[attr-defined]  # admission parses the texts afresh
        admission_ms, after_ms, after_units, verdict = after(expression)
        print(
            f"| {name} | {estimate:,} | {before_ms:,.0f} | {before_units:,} | {admission_ms:,.1f} | {after_ms:,.1f} "
            f"| {after_units:,} | {verdict} |"
        )


if __name__ == "__main__":
    main()
