"""`berth reservations create|list|cancel`: GPUs promised for a future window, through the HTTP API.

`create` is admitted when one node can hold the GPUs in the window; a full window is refused with the nearest
windows that would fit (`window_full`). A reservation is `reserved` until its start, `started` once it has become an
allocation on its node (`berth alloc get` follows that one), then `ended`, `cancelled` or `failed`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer

from cli import values
from cli.client import ApiOption, TenantOption, TokenOption, acting_tenant, api_client
from cli.output import Column, OutputFormat, OutputOption, console, is_data, print_data, styled, table
from cli.queue import local_time
from contracts.placement import CapacityShape

app = typer.Typer(no_args_is_help=True, add_completion=False, help="GPUs promised for a future window.")


@app.command("create")
def create(
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs wanted, on one node.")],
    region: Annotated[str, typer.Option("--region", help="The region.")],
    start: Annotated[
        str,
        typer.Option(
            "--start",
            help="When the window starts: 2026-12-01T09:00Z, tomorrow, now+2h (ISO 8601 or "
            "relative to now, as `date -d` reads them).",
        ),
    ],
    end: Annotated[str | None, typer.Option("--end", help="When it ends (the same forms as --start).")] = None,
    duration: Annotated[
        str | None, typer.Option("--duration", help="Or how long it lasts (48h, 90m; a unit is required).")
    ] = None,
    product: Annotated[str | None, typer.Option("--product", help="GPU product, e.g. H100; unset: any.")] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="One pool (cluster/pool); unset: any that serves it.")
    ] = None,
    shape: Annotated[CapacityShape, typer.Option("--shape", help="gpu_slice or baremetal.")] = CapacityShape.GPU_SLICE,
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Reserve GPUs of one node for a window."""
    starts_at, ends_at = values.rfc3339(start, "--start"), values.rfc3339(end, "--end")
    lasting = values.duration(duration, "--duration")
    tenant = acting_tenant(tenant, token, announce=not is_data(output))
    body = {
        "gpu_count": gpus,
        "region": region,
        "starts_at": starts_at,
        "ends_at": ends_at,
        "duration": lasting,
        "gpu_product": product,
        "pool": pool,
        "shape": shape.value,
        "tenant": tenant,
    }
    with api_client(api, token, tenant) as client:
        # the flags as the API takes them, sent as they are: the API judges them, in its own words
        reservation = client.reservations.create({k: v for k, v in body.items() if v is not None})
    data = reservation.model_dump(mode="json", by_alias=True)
    if is_data(output):
        print_data(data, output)
        return
    console.print(
        styled(
            "Reservation [bold]{}[/] on {}: {} GPUs from {} to {}",
            data["id"],
            data["node"],
            data["gpu_count"],
            data["starts_at"],
            data["ends_at"],
        )
    )


@app.command("list")
def list_(
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Reservations by start (a tenant token: its own)."""
    with api_client(api, token, tenant) as client:
        data = {"reservations": [r.model_dump(mode="json", by_alias=True) for r in client.reservations.list()]}
    if is_data(output):
        print_data(data, output)
        return
    rows = table(
        Column("reservation", key=True),
        "tenant",
        "state",
        "region",
        Column("node", key=True),
        Column("GPUs", number=True),
        "starts",
        "ends",
        Column("allocation", key=True),
        Column("reason", wide=True),
    )
    for r in data["reservations"]:
        rows.add_row(
            r["id"],
            r["tenant"],
            r["state"],
            r["region"],
            r["node"],
            str(r["gpu_count"]),
            _local(r["starts_at"]),
            _local(r["ends_at"]),
            r["allocation_id"] or "-",
            r["reason"] or "-",
        )
    rows.print()


@app.command("cancel")
def cancel(
    reservation_id: Annotated[str, typer.Argument(help="The reservation's id.", show_default=False)],
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel a reservation (after its start, its allocation gives everything back)."""
    with api_client(api, token, tenant) as client:
        data = client.reservations.cancel(reservation_id).model_dump(mode="json", by_alias=True)
    if is_data(output):
        print_data(data, output)
        return
    console.print(styled("Cancelling reservation [bold]{}[/]", data["id"]))


def _local(text: Any) -> str:
    return local_time(datetime.fromisoformat(str(text).replace("Z", "+00:00")))
