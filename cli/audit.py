"""`berth audit [--repair] [--last]` (admin): where PostgreSQL, Temporal and the hosts disagree.

By default an audit runs now (`POST /v1/audit`) and its findings are shown by kind, each with what `--repair` would
do or why it will not now (an allocation still in flight, the orphan VM grace period, an agent that did not
answer). `--repair` also fixes what is safe and lists every fix; `--last` shows the latest recorded audit (the
Schedule runs one every minute) without running one.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from cli.client import ApiOption, TokenOption, api_client
from cli.output import Column, OutputFormat, OutputOption, console, fail, is_data, print_data, styled, table
from contracts.audit import AuditReport

REPAIR_STYLES = {"done": "green", "skipped": "yellow", "failed": "red"}


def audit(
    repair: Annotated[
        bool, typer.Option("--repair", help="Also fix what is safe to fix; every fix is recorded.")
    ] = False,
    last: Annotated[
        bool, typer.Option("--last", help="Show the latest recorded audit instead of running one.")
    ] = False,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Compare PostgreSQL's claims and slots, the open workflows and every agent's VMs and leases (admin token)."""
    if repair and last:
        fail("--repair runs an audit; --last only shows the latest one: pick one")
    with api_client(api, token) as client:
        view = client.audit.latest() if last else client.audit.run(repair=repair)
    if is_data(output):
        print_data(view.model_dump(mode="json", by_alias=True), output)
        return
    if view.report is None:
        console.print("no audit has finished yet; run `berth audit`", style="dim")
        return
    _render(view.report)


def _render(report: AuditReport) -> None:
    when = f"{report.finished_at:%Y-%m-%d %H:%M:%S} UTC" if report.finished_at else "unfinished"
    console.print(
        f"Audit {report.run_id} ({report.trigger}{', repair' if report.repair else ''}) at {when}: "
        f"{len(report.nodes_checked)} host(s) checked",
        highlight=False,
    )
    if not report.findings:
        console.print(styled("[green]no drift[/]: PostgreSQL, Temporal and the hosts agree"))
    else:
        findings = table(
            Column("#", number=True),
            "kind",
            Column("node", key=True),
            Column("allocation", key=True),
            "slots",
            "first seen",
            "repair",
            title="Findings",
        )
        for number, finding in enumerate(report.findings, 1):
            repair = Text("-" if finding.repair is None else finding.repair.value)
            if finding.repair is not None and finding.blocked:
                repair = styled("{} [dim](not now)[/]", repair)
            findings.add_row(
                str(number),
                finding.kind.value,
                finding.node or "-",
                finding.allocation_id or "-",
                ",".join(map(str, finding.slot_indexes)) or "-",
                f"{finding.first_seen:%Y-%m-%d %H:%M:%S}",
                repair,
            )
        findings.print()
        for number, finding in enumerate(report.findings, 1):
            not_now = (
                styled(" [dim](not repaired now: {})[/]", finding.blocked) if finding.repair and finding.blocked else ""
            )
            console.print(styled("{}. {}{}", number, finding.message, not_now), soft_wrap=True)
    if report.repairs:
        repairs = table(
            "kind",
            "action",
            Column("node", key=True),
            Column("allocation", key=True),
            "outcome",
            "what was done",
            title="Repairs",
        )
        for fix in report.repairs:
            style = REPAIR_STYLES.get(fix.outcome, "white")
            repairs.add_row(
                fix.kind.value,
                fix.action.value,
                fix.node or "-",
                fix.allocation_id or "-",
                Text(fix.outcome, style=style),
                fix.message,
            )
        repairs.print()
    elif report.repair:
        console.print("nothing was safe to repair now", style="dim")
