"""`berth context`: which `context.json` the commands here use, why that one, and what it points at.

The file is found as `config.context.find_context` finds it (`BERTH_CONTEXT`, `BERTH_STATE_DIR`, this directory
and its parents, the user's config directory); its tokens are never printed, only the tenants they are for.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from cli.output import OutputFormat, OutputOption, console, fail, is_data, print_data, styled
from config.context import ContextLookup, find_context
from config.settings import Settings

SOURCES = {
    "BERTH_CONTEXT": "named by BERTH_CONTEXT",
    "BERTH_STATE_DIR": "in BERTH_STATE_DIR",
    "this directory": "in this directory",
    "a parent": "in a parent directory",
    "the user's config directory": "in the user's config directory",
}


def _described(lookup: ContextLookup) -> dict[str, Any]:
    context = lookup.context
    return {
        "path": str(lookup.path) if lookup.path else None,
        "source": lookup.source,
        "problem": lookup.problem,
        "searched": [str(path) for path, _ in lookup.searched],
        "api_url": context.api_url if context else None,
        "temporal_address": context.temporal_address if context else None,
        "temporal_namespace": context.temporal_namespace if context else None,
        "temporal_ui_url": context.temporal_ui_url if context else None,
        "admin_token": context is not None and context.admin_token is not None,
        "tenants": sorted(context.tenant_tokens) if context else [],
    }


def context(output: OutputOption = OutputFormat.TEXT) -> None:
    """Show which context file `berth` commands use here (what `berth up` wrote), why that one, and its API."""
    lookup = find_context(Settings())
    if lookup.path is None:
        fail(
            f"no context file: looked for {lookup.places()}; start the dev stack with `berth up`, or set "
            "BERTH_CONTEXT to a context.json"
        )
    why = SOURCES.get(lookup.source or "", lookup.source)
    if lookup.context is None:
        fail(f"{lookup.path} ({why}) {lookup.problem}")
    if is_data(output):
        print_data(_described(lookup), output)
        return
    found = lookup.context
    console.print(styled("context [bold]{}[/] ({})", lookup.path, why))
    shown = Table.grid(padding=(0, 2))
    shown.add_row("API", found.api_url or "-")
    shown.add_row("Temporal", f"{found.temporal_address} (namespace {found.temporal_namespace})")
    shown.add_row("Temporal UI", found.temporal_ui_url or "-")
    holders = (["admin"] if found.admin_token else []) + sorted(found.tenant_tokens)  # whose tokens, never a token
    shown.add_row("Tokens", ", ".join(holders) or "none")
    console.print(shown)
