"""The usage report's vocabulary, shared by the API, the CLI, the console and the store: what a report may be
grouped and bucketed by (store/usage.py maps each grouping to its ledger column), and the report as CSV, one writer
for `berth usage -o csv` and the console's download, so the two files are the same."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contracts.http import UsageReport

GROUPINGS = ("tenant", "product", "region", "pool", "class", "shape")
BUCKETS = ("hour", "day")
COLUMNS = ("gpu_hours", "allocations", "peak_gpus", "share_of_fleet", "reserved_gpu_hours", "node_hours")


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


def group_cells(report: UsageReport) -> list[str]:
    """The report's group columns: its groupings, then `bucket` when it has one."""
    return [*report.by, *(("bucket",) if report.bucket else ())]


def row_values(report: UsageReport) -> list[dict[str, object]]:
    """Each row as {column: value}: its groupings (the bucket in ISO 8601), then COLUMNS."""
    rows = []
    for row in report.rows:
        shown = row.model_dump(by_alias=True)
        values: dict[str, object] = {name: shown.get(name) for name in report.by}
        if report.bucket:
            values["bucket"] = row.bucket.isoformat() if row.bucket else None
        values.update({column: shown[column] for column in COLUMNS})
        rows.append(values)
    return rows


def csv_text(report: UsageReport) -> str:
    """The report as CSV: a header of group_cells and COLUMNS, then a line per row."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*group_cells(report), *COLUMNS], lineterminator="\n")
    writer.writeheader()
    writer.writerows(row_values(report))
    return out.getvalue()
