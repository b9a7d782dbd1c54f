"""The `berth` command line. Each command group lives in its own module; this one wires them together and makes sure
no error reaches a person as a traceback."""

from __future__ import annotations

import os
import sys

import typer

from cli import apply as apply_command
from cli import explain as explain_command
from cli import plan as plan_command
from cli import up as up_command
from cli import worker as worker_command

app = typer.Typer(
    name="berth",
    help="Berth: a GPU capacity control plane. Every allocation and ModelDeployment is a durable Temporal workflow.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("apply")(apply_command.apply)
app.command("up")(up_command.up)
app.command("explain")(explain_command.explain)
app.command("plan")(plan_command.plan)
app.add_typer(worker_command.app, name="worker")


def main() -> None:
    """Entry point: run the app; an unexpected error becomes one line (set BERTH_DEBUG=1 for the traceback)."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if os.environ.get("BERTH_DEBUG"):
            raise
        sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
