"""The usage report's vocabulary, shared by the API, the CLI and the store: what a report may be grouped and
bucketed by (store/usage.py maps each grouping to its ledger column)."""

from __future__ import annotations

GROUPINGS = ("tenant", "product", "region", "pool", "class", "shape")
BUCKETS = ("hour", "day")


def parse_grouping(by: str) -> tuple[str, ...]:
    """`tenant,product` -> ("tenant", "product"). Raises ValueError naming what is wrong: an unknown name (with the
    known ones), a name given twice, or none at all."""
    names = tuple(name.strip() for name in by.split(","))
    if not by.strip() or any(not name for name in names):
        raise ValueError(f"{by!r} is not a comma-separated list of groupings: choose from {', '.join(GROUPINGS)}")
    unknown = [name for name in names if name not in GROUPINGS]
    if unknown:
        raise ValueError(f"cannot group usage by {', '.join(map(repr, unknown))}: choose from {', '.join(GROUPINGS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{by!r} names a grouping twice")
    return names
