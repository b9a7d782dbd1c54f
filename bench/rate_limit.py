"""What a create pays for rate limits kept in PostgreSQL, where every API replica takes from the same bucket.

`python -m bench.rate_limit [--takes 2000] [--repeat 7] [--concurrency 8]` starts an embedded PostgreSQL, migrates
it, and times `CreateLimits.check` (api/rate_limit.py) for: a tenant with no limit (the baseline: nothing to take),
a tenant's bucket, and a tenant's plus the person's; then the same with `--concurrency` creates at once on one
tenant's bucket (they queue on its row lock, as creates of one tenant from several replicas do). Medians of
`--repeat` rounds, per check, in ms; results in docs/benchmarks.md, "Rate limits in PostgreSQL".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from api.rate_limit import CreateLimits, Limit
from bench.database import embedded_database
from store.tokens import Principal

ROOMY = {"creates_per_second": 1e9, "burst": 1_000_000}  # never refuses: every check takes a token
CALLER = Principal(actor="bench@example.com", kind="person", role="member", tenants={"bench": "member"})


async def _round(
    limits: CreateLimits, sessions, tenant_limit: dict[str, object] | None, takes: int, at_once: int
) -> float:
    """Milliseconds per check over `takes` checks, `at_once` of them concurrently."""
    started = time.perf_counter()
    for _ in range(takes // at_once):
        await asyncio.gather(*(limits.check(sessions, "bench", tenant_limit, CALLER) for _ in range(at_once)))
    return (time.perf_counter() - started) * 1000 / takes


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-rate-") as home:
        async with embedded_database(Path(home) / "data", pool_size=max(args.concurrency, 2)) as database:
            cases = {
                "no limit (baseline)": (CreateLimits(), None, 1),
                "tenant's bucket": (CreateLimits(), ROOMY, 1),
                "tenant's and person's": (CreateLimits(person=Limit(1e9, 1_000_000)), ROOMY, 1),
                f"tenant's bucket, {args.concurrency} at once": (CreateLimits(), ROOMY, args.concurrency),
            }
            found: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.repeat):  # the cases alternate, so the machine's noise falls on all of them
                for name, (limits, tenant_limit, at_once) in cases.items():
                    found[name].append(await _round(limits, database.sessions, tenant_limit, args.takes, at_once))
            print(f"\n{args.takes} checks per round, median of {args.repeat} rounds (ms per check)\n")
            print("| limits | per check |\n|---|---:|")
            for name, samples in found.items():
                print(f"| {name} | {statistics.median(samples):.3f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--takes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
