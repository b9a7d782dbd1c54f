"""The `berth` command line. Each command group lives in its own module; this one wires them together and makes sure
no error reaches a person as a traceback."""

from __future__ import annotations

import os
import sys

import typer

from cli import alloc as alloc_command
from cli import apply as apply_command
from cli import audit as audit_command
from cli import demo as demo_command
from cli import deploy as deploy_command
from cli import migrate as migrate_command
from cli import nodes as nodes_command
from cli import placement as placement_command
from cli import plan as plan_command
from cli import tokens as tokens_command
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
app.command("migrate")(migrate_command.migrate)
app.command("up")(up_command.up)
app.command("demo")(demo_command.demo)
app.command("explain")(placement_command.explain)
app.command("capacity")(placement_command.capacity)
app.add_typer(alloc_command.app, name="alloc")
app.add_typer(nodes_command.app, name="nodes")
app.command("audit")(audit_command.audit)
app.add_typer(deploy_command.app, name="deploy")
app.add_typer(tokens_command.app, name="tokens")
app.command("plan")(plan_command.plan)
app.add_typer(worker_command.app, name="worker")


def main() -> None:
    """Entry point. Whatever happens, the process leaves through `os._exit` after flushing its output: commands that
    held a Temporal client can otherwise abort with exit 134 after succeeding (sdk-python#300, TEMPORAL.md). An
    unexpected error becomes one line (set BERTH_DEBUG=1 for the traceback)."""
    code = 0
    try:
        app()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            sys.stderr.write(f"{exit_.code}\n")
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # the last line of defence against tracebacks
        if os.environ.get("BERTH_DEBUG"):
            import traceback

            traceback.print_exc()
        else:
            sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
