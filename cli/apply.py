"""`berth apply -f FILE`: validate fleet files completely here, then apply them through the API (`PUT /v1/fleet`,
the admin role), which writes them in one transaction and records who applied them in its request log.

The files are read and checked before anything is sent, so a problem names the file and document it is in; the API
checks them again (and what only it can: a prune that would take capacity still held). `--dry-run` asks the API to
check without writing. A control plane whose API is not up yet takes its first fleet from `berth migrate --fleet`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from cli.client import ApiOption, TokenOption, api_client
from cli.output import OutputFormat, console, errors, fail, is_data, output_option, print_data, styled
from contracts.http import FleetApplied
from fleet.byo import adopt_node_lists, capability_list
from fleet.errors import FleetError
from fleet.loader import load_fleet

STYLES = {"created": "green", "updated": "yellow", "deleted": "red", "kept": "dim", "carried": "dim"}


def stream(files: list[Path]) -> str:
    """The files as one YAML stream, each file's documents as written. A JSON file is sent as compact JSON (valid
    YAML, whatever its indentation: a tab-indented JSON file is not a YAML document)."""
    texts = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() == ".json":
            text = json.dumps(json.loads(text))
        texts.append(text)
    return "\n---\n".join(texts)


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
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Apply a fleet file: regions, tenants, inference classes and clusters with their pools and hosts."""
    offered = capability_list(capabilities)
    try:
        adopt_node_lists(load_fleet(files), cluster, region, offered)  # every problem, by file, before sending
        text = stream(files)
    except FleetError as exc:
        fail(str(exc))
    except (OSError, ValueError) as exc:  # a file that vanished since, or JSON that is not
        fail(f"cannot read the fleet files: {exc}")
    with api_client(api, token) as client:
        result = client.fleet.apply(
            text, dry_run=dry_run, prune=prune, cluster=cluster, region=region, capabilities=offered or None
        )
    if dry_run:
        counts = result.counts.model_dump()
        if is_data(output):
            print_data({"valid": True, "counts": counts}, output)
        else:
            console.print(f"valid: {', '.join(f'{v} {k}' for k, v in counts.items())}")
        return
    for node in result.skipped:
        errors.print(styled("[yellow]skipped node {}[/]: {}", node.name, node.reason))
    if is_data(output):
        print_data(result.model_dump(mode="json"), output)
        return
    _tell(result)


def _tell(result: FleetApplied) -> None:
    for change in result.changes:
        action = Text(f"{change.action:>7}", style=STYLES[change.action])
        console.print(styled("  {} {}/{}", action, change.kind, change.name))
    console.print(f"applied: {result.summary}", highlight=False)
    if result.deployments_told is None:
        console.print("running deployments re-plan at their next resync (Temporal was not reachable)", highlight=False)
    elif result.deployments_told:
        console.print(f"told {result.deployments_told} running deployment(s) to re-plan", highlight=False)
    for tenant, token in sorted(result.tenant_tokens.items()):
        console.print(f"new API token for tenant {tenant} (shown once): {token}", highlight=False)
