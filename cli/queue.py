"""`berth queue [--region R]`: the requests waiting for capacity, per region, in admission order.

One call to `GET /v1/queues`. Each region is a table: position (among every tenant's requests of the region),
allocation, tenant, priority, the request, the tenant's weighted share, how long it has waited, its deadline and why
it is not placed yet. A tenant (`--tenant`, or a tenant token) sees its own requests at their places in the whole
queue; an admin sees everyone's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.text import Text

from cli.client import ApiOption, TenantOption, TokenOption, api_client
from cli.output import Column, OutputFormat, OutputOption, console, is_data, print_data, styled, table
from contracts.http import QueueItem, QueueList, QueuePlace, RegionQueue


def waited(seconds: float) -> str:
    """90.4 -> "1m30s", 7260 -> "2h1m", 5 -> "5s": how long, to the second (to the minute past an hour)."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def local_time(at: datetime) -> str:
    return at.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def status(place: QueuePlace) -> Text:
    """Why it waits, coloured by what it waits for: green when being placed, yellow when the head holds a node."""
    if place.node is not None:
        return Text(place.status, style="green")
    if place.reserved_node is not None:
        return Text(place.status, style="yellow")
    return Text(place.status)


def priority(place: QueuePlace) -> str:
    return f"{place.priority} ({place.priority_class})" if place.priority_class else str(place.priority)


def _request(item: QueueItem) -> str:
    product = f" {item.gpu_product}" if item.gpu_product else ""
    return f"{item.gpu_count}{product} GPU{'s' if item.gpu_count != 1 else ''}, {item.shape}"


def _render_region(region: RegionQueue) -> None:
    strategy = region.strategy or "no longer in the fleet"
    if not region.length:
        console.print(styled("[bold]{}[/] ({}): nothing waits", region.region, strategy))
        return
    yours = len(region.entries)
    shown = "" if yours == region.length else f", {yours or 'none'} of them yours"
    title = styled("[bold]{}[/] ({}): {} waiting{}", region.region, strategy, region.length, shown)
    if not region.entries:
        console.print(title)
        return
    numbers = ("#", "share", "used", "waited")
    remembers = any(item.decayed_gpu_hours is not None for item in region.entries)
    columns = (
        "#",
        "allocation",
        "tenant",
        "priority",
        "request",
        "share",
        *(("used",) if remembers else ()),
        "waited",
        "deadline",
        "why",
    )
    rows = table(*(Column(c, key=c == "allocation", number=c in numbers) for c in columns), title=title)
    for item in region.entries:
        used = (
            ()
            if not remembers
            else (f"{item.decayed_gpu_hours:,.1f} GPU-h" if item.decayed_gpu_hours is not None else "",)
        )
        rows.add_row(
            str(item.position),
            item.allocation_id,
            item.tenant,
            priority(item),
            _request(item),
            f"{item.share:.1%}" if item.share is not None else "last",
            *used,
            waited(item.waited_seconds),
            local_time(item.deadline_at),
            status(item),
        )
    rows.print()


def render(queues: QueueList) -> None:
    if not queues.regions:
        console.print("no queued requests", style="dim")
        return
    for region in queues.regions:
        _render_region(region)
    console.print(
        "share: the tenant's GPUs beyond its quota over what its cohort tree could lend it, divided by its "
        "weight (Kueue's dominant resource share; it orders a tree with fair sharing)",
        style="dim",
    )
    if any(item.decayed_gpu_hours is not None for region in queues.regions for item in region.entries):
        console.print(
            "used: the tenant's GPU-hours decayed with its tree's usageHalfLife; over its weight, the "
            "lowest goes first in its tree",
            style="dim",
        )


def queue(
    region: Annotated[str | None, typer.Option("--region", help="Only this region's queue.")] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="<cluster>/<pool>: only the requests it could serve, in place.")
    ] = None,
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """The requests waiting for capacity, per region, in the order they will be placed: priority, then the
    tenant's weighted share, then arrival; with how long each has waited and why it is not placed yet."""
    with api_client(api, token, tenant) as client:
        queues = client.queues.get(region=region, pool=pool)
    if is_data(output):
        print_data(queues.model_dump(mode="json", by_alias=True), output)
        return
    render(queues)
