"""`berth usage [--from T] [--to T] [--by tenant,product,...] [--bucket day|hour] [-o text|json|csv]`: what each
tenant used, from the usage ledger (one call to `GET /v1/usage`), in sreport's shape: GPU-hours, allocations, peak
concurrent GPUs and share of the fleet per group. A tenant (`--tenant`, or a tenant token) reads its own.

Times are ISO 8601 (`2026-11-01T00:00:00Z`, a date `2026-11-01` at midnight UTC; a time without an offset is UTC)
or relative to now (`yesterday`, `now-168h`), as cli/values.py reads every time flag. Bad input is one line naming
the flag, before anything is asked of the API.
"""

from __future__ import annotations

import sys
from datetime import datetime
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console

from cli import values
from cli.client import ApiOption, TenantOption, TokenOption, api_client
from cli.output import Column, console, fail, is_data, output_option, print_data, styled, table
from contracts.http import UsageReport
from contracts.usage import BUCKETS, GROUPINGS, csv_text, group_cells, parse_grouping, row_values


class UsageFormat(StrEnum):
    """Every command's formats (cli/output.py), and CSV for a spreadsheet."""

    TEXT = "text"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"
    CSV = "csv"


def instant(value: str | None, flag: str) -> datetime | None:
    return values.instant(value, flag) if value is not None else None


def render(report: UsageReport, to: Console = console) -> None:
    window = f"{report.start:%Y-%m-%d %H:%M}Z to {report.end:%Y-%m-%d %H:%M}Z"
    if not report.rows:
        to.print(styled("no usage from {}", window))
        return
    numbers = ("GPU-hours", "allocations", "peak GPUs", "share of fleet", "reserved GPU-h", "node-hours")
    rows = table(
        *group_cells(report),
        *(Column(name, number=True) for name in numbers),
        title=styled("[bold]usage[/] {} by {}", window, ", ".join(report.by)),
    )
    for cells in row_values(report):
        rows.add_row(
            *(str(cells[name]) if cells[name] is not None else "-" for name in group_cells(report)),
            f"{cells['gpu_hours']:,.2f}",
            str(cells["allocations"]),
            str(cells["peak_gpus"]),
            f"{cells['share_of_fleet']:.1%}" if cells["share_of_fleet"] is not None else "-",
            f"{cells['reserved_gpu_hours']:,.2f}",
            f"{cells['node_hours']:,.2f}",
        )
    rows.print(to)
    note = f"share of fleet: of the {report.fleet_gpus} GPUs the fleet has now"
    if report.rolled_up_before is not None and report.start < report.rolled_up_before:
        note += f"; before {report.rolled_up_before:%Y-%m-%d %H:%M}Z usage is kept per hour (whole hours, peak an upper bound)"
    to.print(note, style="dim")


def write_csv(report: UsageReport) -> None:
    sys.stdout.write(csv_text(report))


def usage(
    start: Annotated[
        str | None, typer.Option("--from", help="Start (RFC 3339 or a date); default 30 days before --to.")
    ] = None,
    end: Annotated[
        str | None, typer.Option("--to", help="End, not included (RFC 3339 or a date); default now.")
    ] = None,
    by: Annotated[str, typer.Option("--by", help=f"Comma-separated groupings: {', '.join(GROUPINGS)}.")] = "tenant",
    bucket: Annotated[str | None, typer.Option("--bucket", help="One row per hour or day, for a chart.")] = None,
    tenant: TenantOption = None,
    output: Annotated[UsageFormat, output_option("text, wide, json, yaml or csv.")] = UsageFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """What each tenant used: GPU-hours exact to the second, allocations, peak concurrent GPUs and share of the
    fleet, grouped as asked (sreport's shape), from the usage ledger."""
    try:
        parse_grouping(by)
    except ValueError as error:
        fail(f"--by: {error}", reason="invalid_argument")
    if bucket is not None and bucket not in BUCKETS:
        fail(f"--bucket {bucket!r}: choose from {', '.join(BUCKETS)}", reason="invalid_argument")
    since, until = instant(start, "--from"), instant(end, "--to")
    if since is not None and until is not None and since >= until:
        fail(f"--from ({since.isoformat()}) is not before --to ({until.isoformat()})", reason="invalid_argument")
    with api_client(api, token, tenant) as client:
        report = client.usage(start=since, end=until, by=by, bucket=bucket)
    if is_data(output):
        print_data(report.model_dump(mode="json", by_alias=True), output)
        return
    if output is UsageFormat.CSV:
        write_csv(report)
        return
    render(report)
