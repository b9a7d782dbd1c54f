"""How every command talks to a person: Rich for text, plain JSON for scripts, one line for an error."""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# Piped into a file or a pager, Rich would assume 80 columns and cut every wide table; a terminal keeps its own width.
PIPED_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    # No emoji codes: a PCI address such as 0000:cd:00.0 holds ":cd:", which Rich would draw as a disc.
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None, emoji=False)


console = make_console()
errors = make_console(stderr=True)


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear error (no traceback) and leave with a non-zero exit code."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
