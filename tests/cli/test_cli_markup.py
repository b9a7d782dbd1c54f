"""What the CLI did not write itself prints as it came, never as Rich markup: a node's reported
`[bold red]FAKE: node healthy[/]` must not be drawn by `berth nodes get` as a red "FAKE: node healthy".

The mechanism is `cli/output.py`'s: consoles read no markup in strings, and the CLI's own styling is a `styled`
template whose values go in as plain text. The first tests pin that mechanism down and check that every styled
literal in `cli/` goes through it; the last two drive the real commands against the API served over HTTP
(tests/api/served.py, as tests/cli/test_cli_api.py does) with data a node or a host put there.
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.text import Text
from sqlalchemy import update
from temporalio.testing import WorkflowEnvironment

import cli
from agent.simulated import simulated_host
from cli.output import make_console, styled
from fleet.loader import parse_fleet
from scheduler.host.report import AgentInfo, NodeReport
from store.db import create_engine, session_factory
from store.models import AllocationEventRow, AllocationRow
from tests.api.stack import api_fleet
from tests.cli.test_cli_api import Terminal, one_error_line, open_terminal

FAKE = "[bold red]FAKE: node healthy[/]"
# A Rich style tag: [bold red], [/dim], [/]; not `.[host]` in a pip command, which was always meant as text.
TAG = re.compile(
    r"\[/?(bold|dim|italic|underline|reverse|red|green|yellow|blue|magenta|cyan|white|link)\b[^\]]*\]|\[/\]"
)


def test_a_console_prints_markup_in_data_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    make_console().print(FAKE)
    make_console().print(styled("node [bold]{}[/] says {!r}: {:>6.1f}", FAKE, FAKE, 2.25))
    assert capsys.readouterr().out.splitlines() == [FAKE, f"node {FAKE} says {FAKE!r}:    2.2"]


def test_styled_keeps_the_templates_styles_and_the_values_own() -> None:
    text = styled("[red]{}[/] and {}", "a\\", Text("ok", style="green"))
    assert text.plain == "a\\ and ok"
    assert [(span.start, span.end, str(span.style)) for span in text.spans] == [(0, 2, "red"), (7, 9, "green")]


def _styled_literals_outside_styled(source: str) -> list[int]:
    """Lines of string literals holding a style tag that are not the template of a `styled` call."""
    tree = ast.parse(source)
    firsts = [
        node.args[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "styled" and node.args
    ]
    templates = {id(first) for first in firsts} | {
        id(branch) for first in firsts if isinstance(first, ast.IfExp) for branch in (first.body, first.orelse)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr | ast.Constant) and id(node) not in templates:
            parts = node.values if isinstance(node, ast.JoinedStr) else [node]
            text = "".join(
                part.value for part in parts if isinstance(part, ast.Constant) and isinstance(part.value, str)
            )
            if TAG.search(text):
                found.append(node.lineno)
    return sorted(set(found))


def test_every_style_in_the_cli_goes_through_styled() -> None:
    """A tag in any other string would now print as text; a markup f-string would put data inside markup."""
    package = Path(cli.__file__).parent
    offenders = {
        path.name: lines
        for path in sorted(package.glob("*.py"))
        if path.name != "output.py" and (lines := _styled_literals_outside_styled(path.read_text()))
    }
    assert offenders == {}
    consoles = [
        path.name for path in package.glob("*.py") if path.name != "output.py" and "Console(" in path.read_text()
    ]
    assert consoles == []  # every console comes from make_console, which reads no markup


@pytest.fixture
def terminal(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Terminal]:
    with open_terminal(database_url, temporal_env, tmp_path, api_fleet()) as opened:
        yield opened


def test_nodes_get_prints_what_a_node_reported_as_it_is(terminal: Terminal) -> None:
    token = terminal.ok("tokens", "create", "--node", "small").splitlines()[-1]
    small = next(
        node for pool in parse_fleet([(None, api_fleet())]).host_pools() for node in pool.nodes if node.name == "small"
    )
    host = simulated_host(small)
    host = host.model_copy(update={"gpus": [gpu.model_copy(update={"driver": FAKE}) for gpu in host.gpus]})
    report = NodeReport(agent=AgentInfo(version=FAKE, interval_seconds=30), topology=host.topology_hash(), host=host)
    answer = httpx.post(
        f"{terminal.served.base_url}/v1/nodes/small/report",
        content=report.model_dump_json(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 200, answer.text

    shown = terminal.ok("nodes", "get", "small")
    assert f"version {FAKE}" in shown
    assert f"is bound to {FAKE}, not vfio-pci" in shown  # the slot's validation message quotes the host's driver
    assert "│ small │" in terminal.ok("nodes", "list")

    missing = terminal.berth("nodes", "get", "no-such-node")
    assert "node 'no-such-node' does not exist" in one_error_line(missing)


def test_alloc_get_and_list_print_reasons_as_they_are(terminal: Terminal, database_url: str) -> None:
    """A failure reason and an attempt's reason can quote what a host said (a libvirt error, an agent's refusal):
    here one is written where the workflow writes it, and the CLI must show it as text."""
    allocation_id = terminal.json("alloc", "create", "--gpus", "2")["id"]
    terminal.wait_for(allocation_id, "active")
    terminal.ok("alloc", "release", allocation_id)
    terminal.wait_for(allocation_id, "released")  # its workflow is over: what the API shows is what is stored

    async def quote_a_host() -> None:
        engine = create_engine(database_url, pool_size=1)
        try:
            async with session_factory(engine).begin() as session:
                mine = AllocationRow.id == allocation_id
                await session.execute(update(AllocationRow).where(mine).values(failure_reason=FAKE, gpu_product=FAKE))
                await session.execute(
                    update(AllocationEventRow)
                    .where(AllocationEventRow.allocation_id == allocation_id)
                    .values(reason=FAKE)
                )
        finally:
            await engine.dispose()

    asyncio.run(quote_a_host())
    shown = terminal.ok("alloc", "get", allocation_id)
    assert any(line.startswith("Failure") and line.rstrip().endswith(FAKE) for line in shown.splitlines()), shown
    assert shown.count(FAKE) >= 3  # the failure, the request's product and the timeline's notes
    listed = terminal.ok("alloc", "list")
    assert f"2 {FAKE} GPUs" in listed

    refused = terminal.berth("alloc", "list", "--tenant", FAKE)  # an error that quotes what was given
    assert f"has no token for tenant {FAKE!r}" in one_error_line(refused)
