"""`berth explain -f FLEET`: would this allocation be placed, where, and if not, why not; offline, from files.

Runs the same scheduling pass as the API's dry-run explain, over a snapshot built from the fleet file. The file may
also hold `kind: SlotState` documents (see fleet/slot_state.py) to ask what-if questions about claimed, leased
or quarantined slots. Output is a Rich report, or with `--output json` the `PlacementResult` JSON documented in
scheduler/README.md. Any error is one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from cli.output import Column, OutputFormat, fail, is_data, make_console, output_option, print_data, styled, table
from contracts.placement import CapacityShape, PlacementRequest, PlacementResult
from fleet.errors import FleetError
from fleet.loader import load_fleet
from scheduler.cel import SelectorError
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement.schedule import schedule
from scheduler.reasons import phrase


def explain(
    file: Annotated[Path, typer.Option("--file", "-f", help="Fleet file (YAML), optionally with SlotState documents.")],
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs requested.")],
    product: Annotated[str | None, typer.Option("--product", help="GPU product, e.g. H200.")] = None,
    shape: Annotated[CapacityShape, typer.Option("--shape", help="gpu_slice or baremetal.")] = CapacityShape.GPU_SLICE,
    region: Annotated[str | None, typer.Option("--region", help="Region; unset lets the scheduler choose.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Apply this tenant's policy and quota.")] = None,
    selector: Annotated[
        list[str] | None, typer.Option("--selector", help="DRA CEL selector over the GPU device (repeatable).")
    ] = None,
    cluster_selector: dict[str, str] | None = None,
    node: list[str] | None = None,
    gpu: list[str] | None = None,
    output: Annotated[OutputFormat, output_option()] = OutputFormat.TEXT,
) -> None:
    """Explain where an allocation would be placed, or why it would not be, without any running service."""
    try:
        fleet = load_fleet([file])
        snapshot = snapshot_from_fleet(fleet, fleet.slot_states.values())
        request = PlacementRequest(
            gpu_count=gpus,
            gpu_product=product,
            shape=shape,
            region=region,
            tenant=tenant,
            selectors=selector or [],
            cluster_selector=cluster_selector or {},
            nodes=frozenset(node or []),
            gpus=frozenset(gpu or []),
        )
        result = schedule(snapshot, request, detail=True)
    except FleetError as exc:
        _fail(str(exc))
    except ValidationError as exc:  # options that contradict each other (--gpu without one --node, a count mismatch)
        _fail("; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors()))
    except ValueError as exc:  # a SlotState naming slots the fleet does not have
        _fail(str(exc))
    except SelectorError as exc:  # does not compile, or costs more than a request may spend
        _fail(f"--selector: {exc}")
    if is_data(output):
        print_data(result.model_dump(mode="json"), output)
    else:
        render(result, gpus)


def _fail(message: str) -> None:
    fail("; ".join(line.strip() for line in message.splitlines() if line.strip()), code=2)


def render(result: PlacementResult, gpus: int) -> None:
    """The placement or refusal, level by level; `berth explain` online renders the API's answer with it too."""
    console = make_console()
    if result.placed:
        console.print(styled("[bold green]Placed[/]: {}", result.explanation.summary))
    else:
        assert result.refusal is not None
        console.print(styled("[bold red]Refused[/] ({}): {}", result.refusal.code, result.refusal.message))

    levels = table(
        "level", Column("in", number=True), Column("out", number=True), "why the rest were dropped", title="Levels"
    )
    for level in result.explanation.levels:
        why = ", ".join(phrase(reason, count, gpus) for reason, count in level.dropped.items())
        levels.add_row(str(level.level), str(level.considered), str(level.passed), why)
    levels.print(console)

    if result.candidates:
        candidates = table(
            Column("rank", number=True),
            Column("node", key=True),
            Column("pool", key=True),
            Column("free bundles", number=True),
            title="Candidates",
        )
        for rank, candidate in enumerate(result.candidates, start=1):
            candidates.add_row(str(rank), candidate.node, candidate.pool, str(candidate.free_bundles))
        candidates.print(console)

    if result.plan is not None:
        plan = table(
            Column("slot", key=True),
            "GPU",
            "fabric VF",
            "NUMA",
            "NVMe",
            "MAC",
            "IP",
            title=f"Plan on {result.plan.node}",
        )
        for bundle in result.plan.bundles:
            plan.add_row(
                str(bundle.slot_id),
                bundle.gpu_pci,
                bundle.fabric_vf_pci or "-",
                str(bundle.numa_node),
                bundle.nvme_device or "-",
                bundle.mac_address or "-",
                bundle.private_ip or "-",
            )
        plan.print(console)
