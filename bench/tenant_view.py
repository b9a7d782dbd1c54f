"""What a tenant's view of the fleet costs: `tenant_view` (Snapshot.within its usable regions) at 10,000 nodes.

A tenant's explain and capacity run over the fleet cut down to the regions its policy admits
(`scheduler.placement.tenant_scope`), built on every such request. Synthetic fleet of bench/placement.py (two regions, half
the nodes each): an unrestricted tenant gets the snapshot itself; one allowed a single region gets a view of half
the nodes. Printed in milliseconds, the fastest and the median run (the median moves with other load on the
machine), next to one `schedule()` over the whole snapshot and over the view for comparison.

    python -m bench.tenant_view [--runs 200]
"""

from __future__ import annotations

import argparse
import statistics

from bench.placement import synthetic_views
from bench.stats import timed_ms
from contracts.placement import PlacementRequest
from scheduler.placement.schedule import schedule
from scheduler.placement.tenant_scope import tenant_view
from scheduler.snapshot import Snapshot
from scheduler.views import TenantView

NODES = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per figure")
    args = parser.parse_args()
    views = synthetic_views(NODES)
    views["tenants"] = [
        TenantView(name="everywhere", gpu_quota=10**6),
        TenantView(name="west-only", gpu_quota=10**6, allowed_regions=frozenset({"us-west"})),
    ]
    world = Snapshot(**views)
    west = tenant_view(world, "west-only")
    request = PlacementRequest(gpu_count=2, tenant="west-only")
    figures = {
        "tenant_view, every region (the snapshot itself)": lambda: tenant_view(world, "everywhere"),
        f"tenant_view, one region ({len(west.nodes):,} of {len(world.nodes):,} nodes)": lambda: tenant_view(
            world, "west-only"
        ),
        "schedule() over the whole snapshot": lambda: schedule(world, request),
        "schedule() over the view": lambda: schedule(west, request),
    }
    print("| what | fastest ms | median ms |")
    print("|---|---:|---:|")
    for what, action in figures.items():
        samples = timed_ms(action, args.runs)
        print(f"| {what} | {min(samples):.3f} | {statistics.median(samples):.3f} |")


if __name__ == "__main__":
    main()
