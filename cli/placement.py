"""`berth explain` and `berth capacity`: the scheduler's answers, asked of the running API.

`berth explain` is one command for both ways of asking: with `-f FLEET` it runs offline on the file (cli/explain.py),
without it asks `POST /v1/explain` about the live fleet; both render the same report and print the same
`PlacementResult` JSON. `berth capacity` tells raw free GPUs from what the node scheduler would accept, per pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli import explain as offline
from cli import values
from cli.alloc import ClusterSelectorOption, GpuOption, NodeOption, SelectorOption, key_values, placement_fields
from cli.client import ApiOption, TenantOption, TokenOption, api_client
from cli.output import Column, OutputFormat, OutputOption, console, is_data, print_data, table
from contracts.placement import CapacityShape, PoolCapacity
from contracts.vocabulary import PoolShape
from scheduler.placement.capacity import SLICE_SIZES


def explain(
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs requested.")],
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Explain offline against this fleet file, not the API.")
    ] = None,
    product: Annotated[str | None, typer.Option("--product", help="GPU product, e.g. H200.")] = None,
    shape: Annotated[CapacityShape, typer.Option("--shape", help="gpu_slice or baremetal.")] = CapacityShape.GPU_SLICE,
    region: Annotated[str | None, typer.Option("--region", help="Region; unset lets the scheduler choose.")] = None,
    tenant: TenantOption = None,
    selector: SelectorOption = None,
    cluster_selector: ClusterSelectorOption = None,
    node: NodeOption = None,
    gpu: GpuOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Explain where an allocation would be placed now, or level by level why it would not be; nothing is reserved.

    With -f FLEET it runs offline on the file; otherwise it asks the running API. Without --tenant (and with an
    admin token) tenant policy and quota are left out."""
    if file is not None:
        offline.explain(
            file=file,
            gpus=gpus,
            product=product,
            shape=shape,
            region=region,
            tenant=tenant,
            selector=selector,
            cluster_selector=key_values(cluster_selector or [], "--cluster-selector"),
            node=node,
            gpu=gpu,
            output=output,
        )
        return
    body = {"gpu_count": gpus, "gpu_product": product, "shape": shape.value, "region": region, "tenant": tenant}
    body = {key: value for key, value in body.items() if value is not None}
    body.update(placement_fields(selector, cluster_selector, node, gpu))
    with api_client(api, token, tenant) as client:
        result = client.explain(body, detail=True)
    if is_data(output):
        print_data(result.model_dump(mode="json", by_alias=True), output)
    else:
        offline.render(result, gpus)


def render_capacity(pools: list[PoolCapacity], title: str = "Capacity") -> None:
    if not pools:
        console.print("no pools match", style="dim")
        return
    numbers = (
        "ready nodes",
        "cooling off",
        "GPUs",
        "validated GPUs",
        "valid slice bundles",
        "raw free",
        "degraded",
        "failed",
        *(f"{size}-GPU" for size in SLICE_SIZES),
        "bare-metal",
    )
    rows = table(
        Column("pool", key=True),
        "region",
        "shape",
        "product",
        *(Column(number, number=True) for number in numbers),
        title=title,
        caption="validated GPUs: GPUs the node agents validated on their hosts; valid slice bundles: those that also "
        "validated as whole slice bundles (GPU with its fabric and storage); cooling off: nodes skipped after repeated "
        "failed attempts (the node breaker); degraded, failed: GPUs that take no new work until repaired; N-GPU: "
        "allocations of that size that would fit now, each size counted alone",
    )
    for pool in pools:
        slices, metal = pool.shape is PoolShape.GPU_SLICE, pool.shape is PoolShape.BAREMETAL
        rows.add_row(
            pool.pool,
            pool.region,
            str(pool.shape),
            pool.gpu_product or "any",
            f"{pool.ready_nodes}/{pool.nodes}",
            str(pool.cooling_off),
            str(pool.gpus),
            str(pool.validated_gpus),
            str(pool.compatible_gpus),
            str(pool.raw_free_gpus),
            str(pool.degraded_gpus),
            str(pool.failed_gpus),
            *(str(pool.slices.get(size, 0)) if slices else "-" for size in SLICE_SIZES),
            str(pool.baremetal_nodes) if metal else "-",
        )
    rows.print()


def capacity(
    region: Annotated[str | None, typer.Option("--region", help="Only pools in this region.")] = None,
    product: Annotated[str | None, typer.Option("--product", help="Only pools of this GPU product.")] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="An instant (ISO 8601, or relative: tomorrow, now+2h): GPUs held, reserved and free then, by pool.",
        ),
    ] = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Per pool: raw free GPUs, and how many 1, 2, 4 and 8-GPU slices or whole bare-metal hosts would fit now; with
    --at, what running allocations that have not ended by then and reservations covering it leave free."""
    if at is not None:
        instant = values.rfc3339(at, "--at")
        with api_client(api, token) as client:
            data = client.capacity.at(instant, region=region).model_dump(mode="json", by_alias=True)
        if is_data(output):
            print_data(data, output)
            return
        numbers = ("GPUs", "held", "reserved", "free", "most on one node")
        rows = table(
            Column("pool", key=True),
            "region",
            "product",
            *(Column(n, number=True) for n in numbers),
            title=f"capacity at {data['at']}",
        )
        for pool in data["pools"]:
            if product is None or (pool["gpu_product"] or "").casefold() == product.casefold():
                counts = (pool[name] for name in ("gpus", "held", "reserved", "free", "largest_free"))
                rows.add_row(pool["pool"], pool["region"], pool["gpu_product"] or "-", *map(str, counts))
        rows.print()
        return
    with api_client(api, token) as client:
        report = client.capacity.now(region=region, gpu_product=product)
    if is_data(output):
        print_data(report.model_dump(mode="json", by_alias=True), output)
    else:
        render_capacity(report.pools)
