"""Host discovery benchmark: `discover_host` over the 8x H200 HGX fixture (tests/hosts), materialised on disk.

    python -m bench.host_discovery [--rounds N]

An agent discovers at start, on change and periodically, and validates its approved slots each time, so this is
the cost an agent pays per report. The fixture has what a real HGX host has that discovery reads (8 GPUs, 8 PFs
with a VF each, 9 NVMe namespaces, 2 NUMA cells, 33 IOMMU groups) but none of the hundreds of other PCI functions
and sysfs attributes a real host has, so read it as the cost of the work, not of a real kernel's sysfs. Reported:
the median and 90th percentile of discovery alone, and of discovery plus `validate_slots` when that exists.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent.host.sysfs import discover_host
from bench.stats import interleaved_ms
from fleet.node import Node
from tests.hosts.sysfs_tree import hgx_h200


def _validation(root: Path, node: Node) -> Callable[[], object] | None:
    """Discovery then validation, when `scheduler.host.validate` is there to call."""
    try:
        from scheduler.host.validate import validate_slots
    except ImportError:
        return None
    return lambda: validate_slots(node.slots, discover_host(root))


def measure(rounds: int) -> list[dict[str, str | float | int]]:
    host = hgx_h200()
    with tempfile.TemporaryDirectory(prefix="berth-host-") as directory:
        root = host.write(Path(directory) / host.name)
        inventory = discover_host(root)
        assert len(inventory.gpus) == 8 and not inventory.problems, inventory.problems
        actions: dict[str, Callable[[], object]] = {"discover_host": lambda: discover_host(root)}
        both = _validation(root, Node.model_validate(host.node))
        if both is not None:
            actions["discover_host + validate_slots"] = both
        return [
            {
                "what": name,
                "rounds": rounds,
                "median ms": statistics.median(samples),
                "p90 ms": statistics.quantiles(samples, n=10)[-1],
            }
            for name, samples in interleaved_ms(actions, rounds).items()
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="discoveries timed")
    args = parser.parse_args()
    rows = measure(max(2, args.rounds))
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join(":---" if column == "what" else "---:" for column in columns) + "|")
    for row in rows:
        cells = [f"{value:,.2f}" if isinstance(value, float) else str(value) for value in row.values()]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
