"""How every command talks to a person: Rich for text, plain JSON or YAML for scripts, one line for an error.

Nothing printed as a string is read as Rich markup: the consoles are made with `markup=False`, so a table cell, a
message or an error holding `[bold red]FAKE: node healthy[/]` (a node's report, a tenant's label, an API error
quoting either) prints exactly as it came. What the CLI itself styles says so: `styled(template,
*values)` reads markup in the template only and puts each value in as plain text, as a query puts in parameters.

One mechanism for every command's output, as kubectl's `-o`: `OutputOption` (or `output_option`) takes `text`,
`wide`, `json` or `yaml` and remembers the choice for the run, so that

    print_data(data, output)   the API's (or the scheduler's) answer unchanged, as JSON or YAML
    table(...).print()         every table: headers in capitals, the columns that name a row (ids, nodes) never
                               cut, and with `-o wide` the columns kept for it and no cutting at all
    fail(message)              one `error:` line on stderr, or with `-o json` / `-o yaml` one JSON object
                               `{"error": {"code", "message", ...}}` on stderr, and a non-zero exit
"""

from __future__ import annotations

import json
import os
import re
import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
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
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


DATA_FORMATS = frozenset({"json", "yaml"})  # the formats that print data rather than text (`berth usage`: csv too)


class _Run:
    """The output format the running command was given: `fail` answers in it and `table` widens for it. Reset by
    `berth` itself at the start of every command (cli/main.py), set by the `--output` option as it is parsed."""

    output: str = OutputFormat.TEXT


run = _Run()


def remember_output(value: Any) -> Any:
    """The `--output` option's callback: every later error and table of this run follows it."""
    run.output = str(value)  # a StrEnum's str() is its value
    return value


def output_option(help: str = "text, wide, json or yaml.") -> Any:
    """The `--output` / `-o` option; `OutputOption` is it for the commands that take the usual four formats."""
    return typer.Option("--output", "-o", help=help, callback=remember_output)


OutputOption = Annotated[OutputFormat, output_option()]


def is_data(output: str) -> bool:
    return str(output) in DATA_FORMATS


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_data(data: Any, output: str) -> None:
    """`data` (JSON-shaped: the API's answer as it came) as JSON or, with `-o yaml`, as YAML."""
    if str(output) == OutputFormat.YAML:
        typer.echo(
            yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False, allow_unicode=True), nl=False
        )
    else:
        print_json(data)


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


def fail(
    message: str, code: int = 1, *, reason: str = "failed", status: int | None = None, details: Any = None
) -> NoReturn:
    """Print one clear error (no traceback) and leave with a non-zero exit code. An API's error (`status` given)
    ends with its code and HTTP status. Under `-o json` or `-o yaml` the error is one JSON object on stderr, as the
    API's envelope: `reason` is its code (the API's own for an API error, `invalid_argument` for a flag the CLI
    could not read, `failed` otherwise), `status` the HTTP status."""
    if is_data(run.output):
        error: dict[str, Any] = {"code": reason, "message": message}
        if status is not None:
            error["status"] = status
        if details is not None:
            error["details"] = details
        typer.echo(json.dumps({"error": error}, default=str), err=True)
    else:
        said = message if status is None else f"{message} ({reason}, HTTP {status})"
        errors.print(styled("[bold red]error:[/] {}", said), soft_wrap=True)
    raise typer.Exit(code)


# Tables --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column of a `table`: `key` names the row (an id, a node's name) and is never cut; `number` is aligned
    right; `wide` is shown with `-o wide` only."""

    header: str
    key: bool = False
    number: bool = False
    wide: bool = False


class Rows:
    """A table being filled: `add_row` takes a cell for every column, `-o wide` ones included, and `print` draws
    those the run's format shows."""

    def __init__(
        self,
        columns: Sequence[Column | str],
        title: RenderableType | None,
        caption: str | None,
        options: dict[str, Any],
    ) -> None:
        self.columns = [column if isinstance(column, Column) else Column(column) for column in columns]
        self.title, self.caption, self.options = title, caption, options
        self.rows: list[tuple[RenderableType, ...]] = []

    def add_row(self, *cells: RenderableType) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)

    def print(self, to: Console | None = None) -> None:
        to = to or console
        wide = run.output == OutputFormat.WIDE
        shown = [index for index, column in enumerate(self.columns) if wide or not column.wide]
        drawn = Table(
            title=self.title, caption=self.caption, title_justify="left", caption_justify="left", **self.options
        )
        for index in shown:
            # Rich wraps the other columns first, then shrinks every column alike: a key column's minimum width is
            # its longest value, so two rows never read the same (`use1-h200…` twice).
            column = self.columns[index]
            longest = max([cell_len(column.header), *(_width(row[index]) for row in self.rows)])
            drawn.add_column(
                column.header.upper(),
                justify="right" if column.number else "left",
                no_wrap=column.key,
                min_width=longest if column.key else None,
            )
        for row in self.rows:
            drawn.add_row(*(row[index] for index in shown))
        if not wide:
            to.print(drawn)
            return
        # Nothing cut, whatever the terminal's width: the lines are as long as the table is wide. Rich draws no
        # wider than its console, so a console as wide as the table, on the same stream with the same colours, does.
        needed = Measurement.get(to, to.options.update_width(1 << 16), drawn).maximum
        colours: Any = to.color_system  # the name of the console's colour system, or None for none
        wide_enough = Console(
            file=to.file,
            width=max(to.width, needed),
            color_system=colours,
            emoji=False,
            force_terminal=to.is_terminal,
            no_color=to.no_color,
            markup=False,
        )
        wide_enough.print(drawn, crop=False)


def _width(cell: RenderableType) -> int:
    if isinstance(cell, Text):
        return max((cell_len(line) for line in cell.plain.splitlines()), default=0)
    if isinstance(cell, str):
        return max((cell_len(line) for line in cell.splitlines()), default=0)
    return 0


def table(
    *columns: Column | str, title: RenderableType | None = None, caption: str | None = None, **options: Any
) -> Rows:
    """Every table the CLI draws, so that they all read alike (`Rows`); `options` go to Rich's `Table` (`box`)."""
    return Rows(columns, title, caption, options)
