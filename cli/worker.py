"""`berth worker control` and `berth worker node --node-id N`: run a Temporal worker in the foreground."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from cli.output import fail
from config.context import NotConfigured, database_url
from config.settings import Settings
from config.temporal import connect
from devstack.stack import default_fleet_file
from fleet.errors import FleetError
from store.db import create_engine, session_factory

app = typer.Typer(help="Run Berth's Temporal workers.", no_args_is_help=True, add_completion=False)


@app.command("control")
def control() -> None:
    """The control-plane worker: allocation workflows and control activities on `berth.control`."""
    import worker

    settings = Settings()

    async def main() -> None:
        engine = create_engine(database_url(settings))
        try:
            await worker.run_control(await connect(settings), session_factory(engine), settings.control_task_queue)
        finally:
            await engine.dispose()

    try:
        asyncio.run(main())
    except (NotConfigured, worker.MissingSearchAttributes) as exc:
        fail(str(exc))
    except RuntimeError as exc:
        fail(f"cannot run the control worker: {exc}")


@app.command("node")
def node(
    node_id: Annotated[str, typer.Option("--node-id", help="The host's node name in the fleet.")],
    fleet: Annotated[Path | None, typer.Option("--fleet", "-f", help="Fleet file describing the host.")] = None,
) -> None:
    """A node agent (simulated host drivers) on `berth.node.<node-id>`."""
    import worker

    settings = Settings()
    fleet_file = fleet or settings.fleet_file or default_fleet_file()
    try:
        agent = worker.simulated_agent(fleet_file, node_id, settings.state_dir)
    except (FleetError, ValueError) as exc:
        fail(str(exc))

    async def main() -> None:
        await worker.run_node(await connect(settings), agent, f"{settings.node_task_queue_prefix}{node_id}")

    try:
        asyncio.run(main())
    except NotConfigured as exc:
        fail(str(exc))
    except RuntimeError as exc:
        fail(f"cannot run the node agent: {exc}")
