"""Figures from samples, one way for every benchmark: how a percentile is read, how a call is timed.

Medians are `statistics.median` (the mean of the middle two of an even count). Any other percentile is the sample
at rank `round(q * (n - 1))` of the sorted samples: a value that was measured, never one interpolated between two.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence


def percentile(samples: Sequence[float], q: float, empty: float = float("nan")) -> float:
    """The sample at the `q` quantile (0 <= q <= 1) of `samples`; `empty` when there are none."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else empty


def p50_p99(samples: Sequence[float]) -> dict[str, float]:
    """The median and the 99th percentile, the pair every latency figure of docs/benchmarks.md gives."""
    return {"p50": statistics.median(samples), "p99": percentile(samples, 0.99)}


def print_figures(figures: Mapping[str, Sequence[float]], names: Mapping[str, str], width: int) -> None:
    """One line per figure: its name, then the p50 and p99 of its samples (seconds) in ms, and how many."""
    for key, name in names.items():
        samples = [1000 * s for s in figures[key]]
        median = statistics.median(samples) if samples else float("nan")
        print(f"  {name:{width}} {median:8.0f} / {percentile(samples, 0.99):8.0f}  (n={len(samples)})")


def timed_ms(action: Callable[[], object], runs: int) -> list[float]:
    """Milliseconds of each of `runs` calls of `action`, one after another."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def interleaved_ms(actions: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call of each action, interleaved round by round so that all of them see the same machine
    noise, after one untimed call of each (the page cache and imports warmed)."""
    samples: dict[str, list[float]] = {name: [] for name in actions}
    for action in actions.values():
        action()
    for _ in range(rounds):
        for name, action in actions.items():
            samples[name].extend(timed_ms(action, 1))
    return samples
