"""`berth apply -f FILE`: validate a fleet file completely, then write it in one transaction."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from cli.output import OutputFormat, console, errors, fail, is_data, output_option, print_data, styled
from cli.plan import capability_list
from config.context import NotConfigured, database_url
from config.settings import Settings
from config.temporal import connect
from contracts.task_queues import Queues
from fleet.byo import adopt_node_lists
from fleet.errors import FleetError
from fleet.fleet import Fleet
from fleet.loader import load_fleet
from store.apply import ApplyRefused, ApplyResult, apply_fleet, refuse_non_inventory
from store.db import create_engine, session_factory
from store.outage import UNREACHABLE_OR_REFUSED, refused_statement
from store.tokens import ensure_tenant_tokens
from workflows.deployment.client import notify_inventory_changed
from workflows.queue_walk.client import ask_for_admission_pass


async def _tell_deployments(settings: Settings, result: ApplyResult) -> int | None:
    """Best effort, after the apply committed: the queues of waiting requests are walked and, where a placement input
    changed (`ApplyResult.replans_deployments`), running deployments re-plan now, instead of at the reconciler's
    next walk and their next resync: what `PUT /v1/fleet` does. How many deployments were told; None when Temporal
    cannot be reached in a few seconds."""
    why = f"fleet applied: {result.summary()}"
    try:
        async with asyncio.timeout(5):
            client = await connect(settings)
            queues = Queues(control=settings.control_task_queue, node_prefix=settings.node_task_queue_prefix)
            await ask_for_admission_pass(client, queues, why)  # waiting requests may fit now
            return await notify_inventory_changed(client, queues, why) if result.replans_deployments() else 0
    except NotConfigured:
        return 0  # no control plane configured: no deployment to tell
    except Exception:  # noqa: BLE001 - Temporal unreachable: the inventory is written all the same
        return None


async def _apply(url: str, fleet: Fleet, prune: bool) -> tuple[ApplyResult, dict[str, str]]:
    """Apply the fleet and give each tenant that has no API token one, in the same transaction."""
    engine = create_engine(url, pool_size=1)
    try:
        async with session_factory(engine).begin() as session:
            return await apply_fleet(session, fleet, prune=prune), await ensure_tenant_tokens(session)
    finally:
        await engine.dispose()


def apply(
    files: Annotated[list[Path], typer.Option("--file", "-f", help="Fleet file (YAML or JSON); repeat for several.")],
    prune: Annotated[bool, typer.Option(help="Delete objects that are in the database but not in the files.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only validate the files; write nothing.")] = False,
    cluster: Annotated[
        str | None, typer.Option(help="Cluster that NodeList documents (kubectl get nodes -o yaml) describe.")
    ] = None,
    region: Annotated[str | None, typer.Option(help="Region of the --cluster a NodeList creates.")] = None,
    capabilities: Annotated[
        str | None,
        typer.Option(help="Comma-separated capabilities (e.g. vllm,sglang) every pool a NodeList creates offers."),
    ] = None,
    output: Annotated[OutputFormat, output_option()] = OutputFormat.TEXT,
) -> None:
    """Apply a fleet file: regions, tenants, inference classes and clusters with their pools and hosts."""
    try:
        if dry_run:
            fleet, _ = adopt_node_lists(load_fleet(files), cluster, region, capability_list(capabilities))
            refuse_non_inventory(fleet)
            counts = {
                "regions": len(fleet.regions),
                "tenants": len(fleet.tenants),
                "classes": len(fleet.classes),
                "clusters": len(fleet.clusters),
                "nodes": sum(len(p.nodes) for p in fleet.pools()),
            }
            print_data({"valid": True, "counts": counts}, output) if is_data(output) else console.print(
                f"valid: {', '.join(f'{v} {k}' for k, v in counts.items())}"
            )
            return
        fleet, skipped = adopt_node_lists(load_fleet(files), cluster, region, capability_list(capabilities))
        for node in skipped:
            errors.print(styled("[yellow]skipped node {}[/]: {}", node.name, node.reason))
        result, tokens = asyncio.run(_apply(database_url(Settings()), fleet, prune))
    except FleetError as exc:
        fail(str(exc))
    except ApplyRefused as exc:
        fail(str(exc))
    except NotConfigured as exc:
        fail(str(exc))
    except UNREACHABLE_OR_REFUSED as exc:
        refused = refused_statement(exc)
        if refused is not None and "does not exist" in refused:
            fail("the database has no Berth schema yet: run `berth migrate` first")
        if refused is not None:
            fail(f"the database refused the apply: {refused}")
        fail(f"cannot reach the database: {exc}")
    changed = result.changed()
    told = asyncio.run(_tell_deployments(Settings(), result)) if changed else 0
    if is_data(output):
        print_data({**result.model_dump(mode="json"), "tenant_tokens": tokens, "deployments_told": told}, output)
        return
    for change in result.changes:
        style = {"created": "green", "updated": "yellow", "deleted": "red", "kept": "dim", "carried": "dim"}[
            change.action
        ]
        console.print(styled("  {} {}/{}", Text(f"{change.action:>7}", style=style), change.kind, change.name))
    console.print(f"applied: {result.summary()}", highlight=False)
    if told is None:
        console.print("running deployments re-plan at their next resync (Temporal was not reachable)", highlight=False)
    elif told:
        console.print(f"told {told} running deployment(s) to re-plan", highlight=False)
    for tenant, token in sorted(tokens.items()):
        console.print(f"new API token for tenant {tenant} (shown once): {token}", highlight=False)
