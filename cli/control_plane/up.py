"""`berth up`: run the development stack in the foreground until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.output import console, fail, styled
from config.context import StackContext
from config.settings import Settings
from devstack.postgres import PostgresStartError
from devstack.real_vms import RealVmsUnavailable
from devstack.stack import AlreadyRunning, DevStack, default_fleet_file, real_vms_fleet_file
from devstack.supervisor import PartFailed
from devstack.temporal import TemporalStartError
from fleet.errors import FleetError


def console_url(api_url: str) -> str:
    """The web console, served by the API process under /console."""
    return f"{api_url.rstrip('/')}/console/"


def sign_in_hint(settings: Settings) -> str:
    """How to sign in to the dev stack's console: the identity provider when one is configured, else a token this
    stack made (the admin's below, kept in the context file that `berth context` names)."""
    token = (
        "paste the admin token (or a tenant's) at its login page: this stack's context file holds them "
        "(`berth context` says where)"
    )
    if settings.oidc_issuer_url:
        return f"with your identity provider ({settings.oidc_issuer_url}), or {token}"
    return token


def _show(context: StackContext, settings: Settings) -> None:
    table = Table.grid(padding=(0, 2))
    table.add_row("Temporal", context.temporal_address + f" (namespace {context.temporal_namespace})")
    table.add_row("Temporal UI", context.temporal_ui_url or "-")
    table.add_row("Database", context.database_url)
    if context.api_url:
        table.add_row("API", context.api_url)
        table.add_row("Console", console_url(context.api_url))
        table.add_row("  sign in", sign_in_hint(settings))
    if context.gateway_address:
        table.add_row("Node gateway", f"{context.gateway_address} (node agents reach Temporal only through it)")
    if context.admin_token:
        table.add_row("Admin token", context.admin_token)
    for tenant, token in sorted(context.tenant_tokens.items()):
        table.add_row(f"Token for {tenant}", token)
    if context.processes:
        table.add_row("Processes", "supervised: one that dies is restarted")
    for part, pid in context.processes.items():
        table.add_row(f"  {part}", f"pid {pid}")
    table.add_row("Context file", str(settings.context_file))
    table.add_row("Supervisor log", str(settings.state_dir / "logs" / "supervisor.log"))
    console.print(table)


def up(
    fleet: Annotated[Path | None, typer.Option("--fleet", "-f", help="Fleet file to apply.")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="Where data and logs live (default ./.berth).")] = None,
    agent_processes: Annotated[
        int, typer.Option("--agent-processes", min=1, help="Split the simulated hosts' agents over N processes.")
    ] = 1,
    control_workers: Annotated[
        int, typer.Option("--control-workers", min=1, max=16, help="Run N control workers on the control queue.")
    ] = 1,
    api_processes: Annotated[
        int, typer.Option("--api-processes", min=1, max=16, help="Run N API processes behind the one API address.")
    ] = 1,
    real_vms: Annotated[
        bool,
        typer.Option(
            "--real-vms",
            help="The hosts' VMs are real guests on this machine's libvirt (QEMU; root), from a Debian image built "
            "once per machine; their GPUs are bookkeeping only. Default fleet: examples/real-vms/fleet.yaml.",
        ),
    ] = False,
) -> None:
    """Run the local stack until Ctrl-C: PostgreSQL, Temporal and its UI, workers, simulated hosts and the API."""
    settings = Settings(**({"state_dir": state_dir} if state_dir else {}))
    default = real_vms_fleet_file() if real_vms else default_fleet_file()
    fleet_file = fleet or settings.fleet_file or default
    if not fleet_file.exists():
        fail(f"fleet file {fleet_file} does not exist (give one with --fleet)")
    stack = DevStack(
        settings,
        fleet_file,
        say=lambda line: console.print(line, style="dim", highlight=False),
        agent_processes=agent_processes,
        control_workers=control_workers,
        api_processes=api_processes,
        real_vms=real_vms,
    )
    try:
        context = stack.start()
    except AlreadyRunning as exc:
        if exc.context is None:
            fail(f"another `berth up` holds {settings.state_dir}/up.lock but has not written its context yet")
        console.print(f"Berth is already running (pid {exc.context.pid}); reusing it.")
        _show(exc.context, settings)
        return
    except (FleetError, PostgresStartError, TemporalStartError, PartFailed, RealVmsUnavailable, OSError) as exc:
        fail(str(exc))

    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    console.print(styled("[bold green]Berth is up.[/]"))
    _show(context, settings)
    console.print("Press Ctrl-C to stop.")
    try:
        stopping.wait()
    finally:
        console.print("stopping ...")
        stack.stop()
        console.print("stopped.")
