"""How every command talks to a person: Rich for text, plain JSON for scripts, one line for an error.

Nothing printed as a string is read as Rich markup: the consoles are made with `markup=False`, so a table cell, a
message or an error holding `[bold red]FAKE: node healthy[/]` (a node's report, a tenant's label, an API error
quoting either) prints exactly as it came (issue 21). What the CLI itself styles says so: `styled(template,
*values)` reads markup in the template only and puts each value in as plain text, as a query puts in parameters.
"""

from __future__ import annotations

import json
import os
import re
import string
import sys
from enum import StrEnum
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

# Piped into a file or a pager, Rich would assume 80 columns and cut every wide table; a terminal keeps its own width.
PIPED_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    # No emoji codes: a PCI address such as 0000:cd:00.0 holds ":cd:", which Rich would draw as a disc. No markup in
    # strings: what the CLI styles is a `styled` Text, and everything else is data, printed as it is.
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None, emoji=False, markup=False)


console = make_console()
errors = make_console(stderr=True)


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


_FIELD = re.compile("\x00(\\d+)\x00")


class _Fields(string.Formatter):
    """Formats each value on its own (format spec and conversion as `str.format` does) and leaves a marker that
    cannot be markup in its place, so the template's markup is parsed without any value in it."""

    def __init__(self) -> None:
        self.values: list[Text] = []

    def format_field(self, value: Any, format_spec: str) -> str:
        # A Text's own style becomes a span, so the template's styles go beneath it rather than over it.
        self.values.append(Text().append_text(value) if isinstance(value, Text) else Text(format(value, format_spec)))
        return f"\x00{len(self.values) - 1}\x00"


def styled(template: str, *values: Any, **named: Any) -> Text:
    """`template` (the CLI's own words, Rich markup allowed) with `values` put in as `str.format` would, as plain
    text: `styled("node [bold]{}[/] is {}", name, status)`. A value that is a `Text` keeps its own styles; the
    template's styles around a field apply to the value beneath them."""
    fields = _Fields()
    marked = Text.from_markup(fields.format(template.replace("\x00", ""), *values, **named), emoji=False)
    result, position = Text(style=marked.style, end=marked.end), 0
    for field in _FIELD.finditer(marked.plain):
        result.append_text(marked[position : field.start()])
        around = marked[field.start() : field.end()]  # the template's styles where the field stands
        value = fields.values[int(field.group(1))]
        for span in around.spans:
            value.stylize_before(span.style)
        result.append_text(value)
        position = field.end()
    result.append_text(marked[position:])
    return result


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear error (no traceback) and leave with a non-zero exit code."""
    errors.print(styled("[bold red]error:[/] {}", message), soft_wrap=True)
    raise typer.Exit(code)
