"""`berth nodes list|get|cordon|uncordon|drain|repair` (admin) and `berth nodes discover` (on a host, no services).

A node's status says what it is doing (api/routes/nodes.py): READY takes new allocations, NOT_READY has no live
agent, CORDONED keeps what it has and takes nothing new, DRAINING was drained (its allocations' owners told to
move), DOWN is the fleet file's; uncordon makes a cordoned or drained node READY again. `list` and `get`
show each agent's liveness, the slots its host did not validate and those whose GPU is not healthy;
`repair` marks slots repaired once their GPU is fixed. `discover` reads this machine (or a tree shaped
like /sys) and prints what it has, which approved slots validate, and a suggested slot block for the fleet file.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from cli.client import ApiOption, TokenOption, api_client
from cli.discover import discover
from cli.output import Column, OutputFormat, OutputOption, console, is_data, print_data, styled, table
from contracts.http import NodeInfo, NodeState

app = typer.Typer(help="GPU hosts (admin token).", no_args_is_help=True, add_completion=False)

NodeArgument = Annotated[str, typer.Argument(help="The node's name.", show_default=False)]
STATUS_STYLES = {"READY": "green", "NOT_READY": "red", "CORDONED": "yellow", "DRAINING": "yellow", "DOWN": "red"}


def _status(node: NodeInfo) -> Text:
    text = Text(str(node.status), style=STATUS_STYLES.get(node.status, "white"))
    return text if node.status == node.declared_status else styled("{} [dim](fleet: {})[/]", text, node.declared_status)


def _render(nodes: list[NodeInfo]) -> None:
    if not nodes:
        console.print("no nodes", style="dim")
        return
    numbers = ("GPUs", "validated GPUs", "valid slice bundles", "free", "reserved", "quarantined")
    rows = table(
        Column("node", key=True),
        Column("pool", key=True),
        "region",
        "shape",
        "product",
        "status",
        "agent",
        *(Column(number, number=True) for number in numbers),
        "invalid slots",
        Column("agent version", wide=True),
        Column("labels", wide=True),
    )
    for node in nodes:
        rows.add_row(
            node.name,
            node.pool,
            node.region or "-",
            node.shape,
            node.gpu_product or "-",
            _status(node),
            _agent(node),
            str(node.gpus),
            str(node.validated_gpus),
            str(node.compatible_gpus),
            str(node.available_slots),
            str(node.reserved_slots),
            str(node.quarantined_slots),
            ", ".join(f"{slot.index}: {slot.reason or slot.validation}" for slot in node.invalid_slots) or "-",
            node.agent.version or "-",
            ",".join(f"{key}={value}" for key, value in sorted(node.labels.items())) or "-",
        )
    rows.print()


def _agent(node: NodeInfo) -> Text:
    agent = node.agent
    seen = f" {agent.seen_at:%H:%M:%S}" if agent.seen_at else ""
    return Text.assemble((agent.state, {"live": "green", "down": "red"}.get(agent.state, "yellow")), seen)


@app.command("list")
def list_(
    region: Annotated[str | None, typer.Option("--region", help="Only nodes in this region.")] = None,
    status: Annotated[
        NodeState | None,
        typer.Option("--status", help="Only nodes doing this (NOT_READY: READY without a live agent)."),
    ] = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Every node with its pool, status and slot usage."""
    with api_client(api, token) as client:
        nodes = list(client.nodes.list(region=region, status=status.value if status else None))  # every page
    # an operator's list is the whole fleet: one list, as if one page
    data = {"nodes": [node.model_dump(mode="json", by_alias=True) for node in nodes], "next_cursor": None}
    if is_data(output):
        print_data(data, output)
    else:
        _render(nodes)


@app.command("get")
def get(
    node: NodeArgument, output: OutputOption = OutputFormat.TEXT, api: ApiOption = None, token: TokenOption = None
) -> None:
    """One node: its agent, every slot that does not validate or is not healthy with the agent's reason, and every
    slot's health signals with their last reported values."""
    with api_client(api, token) as client:
        data = client.nodes.get(node).model_dump(mode="json", by_alias=True)
    if is_data(output):
        print_data(data, output)
        return
    info = NodeInfo.model_validate(data)
    _render([info])
    agent = info.agent
    console.print(
        f"agent: {agent.state}, last seen {agent.seen_at or 'never'}, version {agent.version or '-'}"
        + (f", down: {agent.down_reason}" if agent.down_reason else ""),
        highlight=False,
    )
    if agent.vm_runtime:
        console.print(f"VM runtime: {agent.vm_runtime}", highlight=False)
    if agent.slices_blocked:
        console.print(agent.slices_blocked, style="yellow", highlight=False)
    for held in info.quarantined:
        console.print(styled("  slot {}: [red]quarantined[/]: {}", held.index, held.reason or "no reason recorded"))
    for slot in info.invalid_slots:
        console.print(
            f"  slot {slot.index} ({slot.gpu_pci}): {slot.validation} {slot.reason or ''}: "
            f"{slot.message or 'no report from its agent yet'}",
            highlight=False,
        )
    for sick in info.unhealthy:
        health = Text(sick.health, style="red" if sick.health == "failed" else "yellow")
        console.print(
            styled(
                "  slot {} ({}): {} since {}: {}",
                sick.index,
                sick.gpu_pci,
                health,
                sick.since or "-",
                "; ".join(sick.reasons) or "no reason given",
            )
        )
    if info.signals:
        signals = table(
            Column("slot", key=True),
            "health",
            "signal",
            "last value",
            "reported",
            title="health signals (as the agent last reported them)",
        )
        for slot in info.signals:
            for number, (name, value) in enumerate(slot.signals.items()):
                first = number == 0
                signals.add_row(
                    str(slot.index) if first else "",
                    slot.health if first else "",
                    name,
                    value,
                    str(slot.reported_at or "-") if first else "",
                )
        signals.print()


@app.command("drain")
def drain(
    node: NodeArgument, output: OutputOption = OutputFormat.TEXT, api: ApiOption = None, token: TokenOption = None
) -> None:
    """Stop placing on the node (DRAINING) and tell each allocation on it to move: its owner releases it when ready.
    `uncordon` ends the drain."""
    with api_client(api, token) as client:
        data = client.nodes.drain(node).model_dump(mode="json", by_alias=True)
    if is_data(output):
        print_data(data, output)
        return
    info = NodeInfo.model_validate(data["node"])
    console.print(
        styled(
            "node [bold]{}[/] is {}; told {} allocation(s){}",
            node,
            _status(info),
            len(data["told"]),
            f", could not tell {', '.join(data['not_told'])}" if data["not_told"] else "",
        )
    )


@app.command("repair")
def repair(
    node: NodeArgument,
    slots: Annotated[list[int], typer.Option("--slot", help="A repaired slot's index (repeat for several).")],
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Mark slots repaired after their GPU was fixed or replaced: they take work again until their agent judges
    otherwise (recorded in the audit trail)."""
    with api_client(api, token) as client:
        data = client.nodes.repair(node, slots).model_dump(mode="json", by_alias=True)
    if is_data(output):
        print_data(data, output)
        return
    for slot in data["repaired"]:
        console.print(styled("slot {} of [bold]{}[/] repaired (was {})", slot["index"], data["node"], slot["was"]))


app.command("discover")(discover)


def _set_status(node: str, action: str, output: OutputFormat, api: str | None, token: str | None) -> None:
    with api_client(api, token) as client:
        data = getattr(client.nodes, action)(node).model_dump(mode="json", by_alias=True)
        if is_data(output):
            print_data(data, output)
        else:
            info = NodeInfo.model_validate(data)
            console.print(styled("node [bold]{}[/] is {}", info.name, _status(info)))


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
