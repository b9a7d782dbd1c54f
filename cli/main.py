"""The `berth` command line. Each command group lives in its own module; this one wires them together and makes sure
no error reaches a person as a traceback.

A command's module is imported only when that command runs (or when `berth --help` lists them all): together the
modules import the API, SQLAlchemy and the whole control plane, and a GPU host running `berth worker node` must not
carry them (agent/serve.py).

The commands that start or set up the control plane's parts live in cli/control_plane/ and need the `server` extra.
In an install of the client alone (`pip install berth`) their modules cannot be imported: `berth --help` still lists
them, with a one-line help saying what to install, and running one says so in one error line (exit 1).
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
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from cli.output import OutputFormat, fail, is_data, run

# What `app.command` and `app.add_typer` make (Typer's own click classes: it carries its own copy of click).
Command = TyperCommand | TyperGroup

# Every command: its name, the module that defines it and the name there (a function for a command, a Typer app for
# a group), in the order `berth --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "apply": ("cli.apply", "apply"),
    "migrate": ("cli.control_plane.migrate", "migrate"),
    "up": ("cli.control_plane.up", "up"),
    "demo": ("cli.control_plane.demo", "demo"),
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
    "worker": ("cli.control_plane.worker", "app"),
    "gateway": ("cli.control_plane.gateway", "gateway"),
}
# Commands of a group that live in another module than the group's: a control-plane command kept under the client
# group a person knows it by. Group name -> its command's name -> (module, function).
SUBCOMMANDS: dict[str, dict[str, tuple[str, str]]] = {
    "tokens": {"gateway-key": ("cli.control_plane.gateway_key", "gateway_key")},
}
# Berth's own top-level packages and modules: one of them missing is a bug to show, not an extra to install.
OWN_PACKAGES = frozenset(
    {
        "activities", "agent", "api", "bench", "berth", "cli", "config", "contracts", "devstack", "fleet", "gateway",
        "scheduler", "store", "worker", "workflows",
    }
)  # fmt: skip
SERVER_EXTRA = "pip install 'berth[server]'"


def missing_package(error: ModuleNotFoundError) -> str | None:
    """The package an import found missing when it is not Berth's own (a dependency of an extra this install lacks),
    else None."""
    top = (error.name or "").split(".")[0]
    return top if top and top not in OWN_PACKAGES else None


def needs_server(command: str, package: str) -> str:
    """The one line that says a command needs the server extra, which this install lacks."""
    return f"`berth {command}` needs the control plane's packages ({package} is not installed): {SERVER_EXTRA}"


def unavailable(command: str, package: str) -> Command:
    """A stand-in for a command whose module cannot be imported here: listed with a one-line help, and failing in
    one line whatever it is given."""

    def refuse() -> None:
        fail(needs_server(command, package))

    holder = typer.Typer(add_completion=False, callback=lambda: None)
    holder.command(
        command.rsplit(" ", 1)[-1],
        help=f"Needs the server extra: {escape(SERVER_EXTRA)}.",  # Typer's help reads Rich markup: [server] is text
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )(refuse)
    group = cast(TyperGroup, typer.main.get_command(holder))
    return cast(Command, group.commands[command.rsplit(" ", 1)[-1]])


def _click_command(name: str, target: Any) -> Command:
    """`target` (a function for a command, a Typer app for a group) as the click command `name`, as `app.command` /
    `app.add_typer` would have made it."""
    holder = typer.Typer(add_completion=False, callback=lambda: None)  # a callback: always a group, even of one
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
    group = cast(TyperGroup, typer.main.get_command(holder))
    return cast(Command, group.commands[name])


def _imported(path: str, module: str, attribute: str) -> Any | Command:
    """`module.attribute`, or a stand-in for the command `path` when the module needs a package not installed."""
    try:
        return getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError as error:
        package = missing_package(error)
        if package is None:
            raise
        return unavailable(path, package)


def load_command(name: str) -> Command:
    """Import one command's module and build its click command as `app.command` / `app.add_typer` would have, with
    the commands SUBCOMMANDS adds to it; a stand-in when the module needs packages this install lacks."""
    target = _imported(name, *COMMANDS[name])
    if isinstance(target, TyperCommand | TyperGroup):
        return target
    command = _click_command(name, target)
    for sub, (module, attribute) in SUBCOMMANDS.get(name, {}).items():
        found = _imported(f"{name} {sub}", module, attribute)
        cast(TyperGroup, command).add_command(
            found if isinstance(found, TyperCommand | TyperGroup) else _click_command(sub, found), sub
        )
    return command


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


def _command_line() -> str:
    """The command being run, as `berth` was given it, up to its first option (`alloc list`)."""
    words: list[str] = []
    for word in sys.argv[1:]:
        if word.startswith("-"):
            break
        words.append(word)
    return " ".join(words[:2])


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
        # A package of an extra this install lacks, imported as the command ran: say what to install.
        package = missing_package(exc) if isinstance(exc, ModuleNotFoundError) else None
        message = f"{type(exc).__name__}: {exc}" if package is None else needs_server(_command_line(), package)
        if os.environ.get("BERTH_DEBUG"):
            import traceback

            traceback.print_exc()
        elif is_data(run.output):
            sys.stderr.write(json.dumps({"error": {"code": "internal_error", "message": message}}) + "\n")
        else:
            sys.stderr.write(f"error: {message}\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
