"""The `berth` command line. Each command group lives in its own module; this one wires them together and makes sure
no error reaches a person as a traceback.

A command's module is imported only when that command runs (or when `berth --help` lists them all): together the
modules import the API, SQLAlchemy and the whole control plane, and a GPU host running `berth worker node` must not
carry them (agent/serve.py).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator, MutableMapping
from importlib import metadata
from typing import Annotated, Any, cast

import typer
from typer.core import TyperCommand, TyperGroup

from cli.output import OutputFormat, is_data, run

# What `app.command` and `app.add_typer` make (Typer's own click classes: it carries its own copy of click).
Command = TyperCommand | TyperGroup

# Every command: its name, the module that defines it and the name there (a function for a command, a Typer app for
# a group), in the order `berth --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "apply": ("cli.apply", "apply"),
    "migrate": ("cli.migrate", "migrate"),
    "up": ("cli.up", "up"),
    "demo": ("cli.demo", "demo"),
    "explain": ("cli.placement", "explain"),
    "capacity": ("cli.placement", "capacity"),
    "audit": ("cli.audit", "audit"),
    "plan": ("cli.plan", "plan"),
    "alloc": ("cli.alloc", "app"),
    "queue": ("cli.queue", "queue"),
    "usage": ("cli.usage", "usage"),
    "reservations": ("cli.reservations", "app"),
    "nodes": ("cli.nodes", "app"),
    "deploy": ("cli.deploy", "app"),
    "context": ("cli.context", "context"),
    "login": ("cli.login", "login"),
    "whoami": ("cli.login", "whoami"),
    "logout": ("cli.login", "logout"),
    "tokens": ("cli.tokens", "app"),
    "worker": ("cli.worker", "app"),
    "gateway": ("cli.gateway", "gateway"),
}


def load_command(name: str) -> Command:
    """Import one command's module and build its click command as `app.command` / `app.add_typer` would have."""
    module, attribute = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer(add_completion=False, callback=lambda: None)  # a callback: always a group, even of one
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
    group = cast(TyperGroup, typer.main.get_command(holder))
    return cast(Command, group.commands[name])


class LazyCommands(MutableMapping[str, Command]):
    """The top-level group's commands: every name is known from the start (help, typo suggestions), a command's
    module is imported the first time the command is looked up."""

    def __init__(self) -> None:
        self._loaded: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self._loaded[name] = load_command(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*COMMANDS, *(name for name in self._loaded if name not in COMMANDS)])

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._loaded))


class LazyGroup(TyperGroup):
    """`berth` itself: a Typer group whose commands are a `LazyCommands`."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands()


app = typer.Typer(
    name="berth",
    help="Berth: a GPU capacity control plane. Every allocation and ModelDeployment is a durable Temporal workflow.",
    cls=LazyGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def berth_version() -> str:
    """The installed distribution's version (the one `pip install` recorded), as `berth --version` prints it."""
    try:
        return metadata.version("berth")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"berth {berth_version()}")
        raise typer.Exit()


@app.callback()
def _berth(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print berth's version and exit.")
    ] = False,
) -> None:
    """Before every command: its output is text until its own `--output` says otherwise (cli/output.py)."""
    run.output = OutputFormat.TEXT


def main() -> None:
    """Entry point. Whatever happens, the process leaves through `os._exit` after flushing its output: commands that
    held a Temporal client can otherwise abort with exit 134 after succeeding (sdk-python#300, docs/design.md "Temporal practice"). An
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
        elif is_data(run.output):
            sys.stderr.write(
                json.dumps({"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}}) + "\n"
            )
        else:
            sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
