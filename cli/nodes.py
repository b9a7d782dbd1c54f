"""`berth nodes list|cordon|uncordon` (admin): the GPU hosts, their slot usage, and taking them out of placement.

A cordoned node takes no new allocations and keeps the ones it has; uncordon makes it READY again.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from api.models import NodeInfo, NodeList
from cli.client import ApiOption, OutputOption, TokenOption, api_client, segment
from cli.output import OutputFormat, console, print_json
from fleet.node import NodeStatus

app = typer.Typer(help="GPU hosts (admin token).", no_args_is_help=True, add_completion=False)

NodeArgument = Annotated[str, typer.Argument(help="The node's name.", show_default=False)]
STATUS_STYLES = {"READY": "green", "CORDONED": "yellow", "DRAINING": "yellow", "DOWN": "red"}


def _status(node: NodeInfo) -> str:
    text = f"[{STATUS_STYLES.get(node.status, 'white')}]{node.status}[/]"
    return text if node.status == node.declared_status else f"{text} [dim](fleet: {node.declared_status})[/]"


def _render(nodes: list[NodeInfo]) -> None:
    if not nodes:
        console.print("no nodes", style="dim")
        return
    table = Table(title_justify="left")
    for column in ("node", "pool", "region", "shape", "product", "status", "GPUs", "free", "reserved", "quarantined"):
        table.add_column(column, justify="right" if column in ("GPUs", "free", "reserved", "quarantined") else "left")
    for node in nodes:
        table.add_row(
            node.name,
            node.pool,
            node.region or "-",
            node.shape,
            node.gpu_product or "-",
            _status(node),
            str(node.gpus),
            str(node.available_slots),
            str(node.reserved_slots),
            str(node.quarantined_slots),
        )
    console.print(table)


@app.command("list")
def list_(
    region: Annotated[str | None, typer.Option("--region", help="Only nodes in this region.")] = None,
    status: Annotated[NodeStatus | None, typer.Option("--status", help="Only nodes with this status.")] = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Every node with its pool, status and slot usage."""
    with api_client(api, token) as client:
        data = client.call("GET", "/v1/nodes", params={"region": region, "status": status.value if status else None})
        if output is OutputFormat.JSON:
            print_json(data)
        else:
            _render(NodeList.model_validate(data).nodes)


def _set_status(node: str, action: str, output: OutputFormat, api: str | None, token: str | None) -> None:
    with api_client(api, token) as client:
        data = client.call("POST", f"/v1/nodes/{segment(node)}/{action}")
        if output is OutputFormat.JSON:
            print_json(data)
        else:
            info = NodeInfo.model_validate(data)
            console.print(f"node [bold]{info.name}[/] is {_status(info)}", highlight=False)


@app.command("cordon")
def cordon(
    node: NodeArgument, output: OutputOption = OutputFormat.TEXT, api: ApiOption = None, token: TokenOption = None
) -> None:
    """Stop placing new allocations on the node; the ones it has stay."""
    _set_status(node, "cordon", output, api, token)


@app.command("uncordon")
def uncordon(
    node: NodeArgument, output: OutputOption = OutputFormat.TEXT, api: ApiOption = None, token: TokenOption = None
) -> None:
    """Let the node take new allocations again."""
    _set_status(node, "uncordon", output, api, token)
