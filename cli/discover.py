"""`berth nodes discover`: what this host has, which approved slots validate against it, and a suggested slot block.

Runs on the host itself with no services: the same discovery (`agent.host.sysfs`) and the same pure checks
(`scheduler.host.validate`) the node agent reports with. The approved slots come from a fleet file (`--fleet` and
`--node-id`); without them it only describes the host and suggests slots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.text import Text

from agent.host.gpu_details import GpuDetails, NvmlDetails, RecordedNvidiaSmi
from agent.host.sysfs import discover_host
from cli.output import Column, OutputFormat, OutputOption, console, fail, is_data, print_data, styled, table
from fleet.errors import FleetError
from fleet.loader import load_fleet
from fleet.node import Node
from scheduler.host.checks import NodeValidation, ValidationState
from scheduler.host.inventory import HostInventory
from scheduler.host.suggest import suggest_slots
from scheduler.host.validate import validate_slots

STATE_STYLES = {ValidationState.VALID: "green", ValidationState.RAW_ONLY: "yellow", ValidationState.INVALID: "red"}


def discover(
    root: Annotated[Path, typer.Option("--root", help="Read sysfs, /dev and /proc under this directory.")] = Path("/"),
    fleet: Annotated[
        Path | None, typer.Option("--fleet", "-f", help="Fleet file with this node's approved slots.")
    ] = None,
    node_id: Annotated[str | None, typer.Option("--node-id", help="This host's node name in the fleet file.")] = None,
    nvidia_smi: Annotated[
        Path | None, typer.Option("--nvidia-smi-xml", help="A recorded `nvidia-smi -q -x` instead of NVML.")
    ] = None,
    suggest: Annotated[
        bool, typer.Option("--suggest", help="Print a suggested slot block for the fleet file.")
    ] = False,
    output: OutputOption = OutputFormat.TEXT,
) -> None:
    """What this host has (GPUs, fabric PFs and VFs, NVMe, NUMA), and which approved slots validate."""
    if (fleet is None) != (node_id is None):
        fail("give both --fleet FILE and --node-id NODE to validate approved slots, or neither")
    # NVML describes the machine it runs on: ask it only when reading that machine.
    details: GpuDetails | None = RecordedNvidiaSmi(nvidia_smi) if nvidia_smi else None
    if details is None and root == Path("/"):
        details = NvmlDetails()
    host = discover_host(root, gpu_details=details)
    node = _approved_node(fleet, node_id) if fleet is not None and node_id is not None else None
    validation = validate_slots(node.slots, host) if node is not None else None
    suggested = suggest_slots(host) if suggest else None
    if is_data(output):
        result: dict[str, Any] = {"host": host.model_dump(mode="json"), "topology": host.topology_hash()}
        if validation is not None:
            result["validation"] = validation.model_dump(mode="json")
        if suggested is not None:
            result["suggestedSlots"] = suggested
        print_data(result, output)
        return
    _render_host(host)
    if validation is not None and node is not None:
        _render_validation(node, validation)
    if suggested is not None:
        console.print("\nSuggested slots (fill in mac and privateIp):", style="bold")
        console.print(yaml.safe_dump({"slots": suggested}, sort_keys=False), highlight=False, markup=False)


def _approved_node(fleet: Path, node_id: str) -> Node:
    try:
        loaded = load_fleet([fleet])
    except FleetError as error:
        fail(str(error))
    node = next((n for pool in loaded.host_pools() for n in pool.nodes if n.name == node_id), None)
    if node is None:
        fail(f"node {node_id!r} is not in {fleet}")
    return node


def _render_host(host: HostInventory) -> None:
    console.print(f"host {host.hostname or '?'}, topology {host.topology_hash()}", style="bold", highlight=False)
    gpus = table(Column("GPU", key=True), "product", "memory", "driver", "NUMA", "IOMMU group", title="GPUs")
    for gpu in host.gpus:
        memory = f"{gpu.memory_mib} MiB" if gpu.memory_mib else "-"
        gpus.add_row(gpu.address, gpu.product, memory, gpu.driver or "-", _n(gpu.numa_node), _n(gpu.iommu_group))
    gpus.print()
    fabric = table(Column("fabric", key=True), "role", "parent", "VFs", "driver", "NUMA", "IOMMU group", title="Fabric")
    for device in host.fabric:
        fabric.add_row(
            device.address,
            device.role.value,
            device.parent or "-",
            str(len(device.vfs)) if device.vfs else "-",
            device.driver or "-",
            _n(device.numa_node),
            _n(device.iommu_group),
        )
    fabric.print()
    nvme = table(Column("NVMe", key=True), "wwid", "size", "NUMA", "by-id", "in use", title="NVMe")
    for namespace in host.nvme:
        size = f"{namespace.size_bytes / 1e12:.2f} TB" if namespace.size_bytes else "-"
        nvme.add_row(
            namespace.name,
            namespace.wwid or "-",
            size,
            _n(namespace.numa_node),
            namespace.by_id[0] if namespace.by_id else "-",
            "; ".join(namespace.in_use) or "-",
        )
    nvme.print()
    for cell in host.numa:
        console.print(f"NUMA {cell.id}: {len(cell.cpus)} CPUs, {cell.memory_mib} MiB", highlight=False)
    for problem in host.problems:
        console.print(styled("[red]unreadable[/] {}: {}", problem.path, problem.message))


def _render_validation(node: Node, validation: NodeValidation) -> None:
    slots = table(Column("slot", key=True), "GPU", "state", "reason", title=f"Approved slots of {node.name}")
    for verdict in validation.slots:
        slot = next(s for s in node.slots if s.index == verdict.index)
        style = STATE_STYLES.get(verdict.state, "white")
        slots.add_row(
            str(verdict.index), slot.gpu_pci, Text(verdict.state.value, style=style), "; ".join(verdict.messages) or "-"
        )
    slots.print()
    valid = sum(1 for v in validation.slots if v.state is ValidationState.VALID)
    raw = sum(1 for v in validation.slots if v.state.counts_raw)
    console.print(f"{raw} raw GPUs validate, {valid} of them as slice bundles", highlight=False)
    if validation.slices_blocked:
        console.print(validation.slices_blocked, style="yellow", highlight=False, soft_wrap=True)


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)
