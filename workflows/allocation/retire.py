"""Before deploying code that retires an allocation workflow revision: which open runs it could not run, and the
`hand_over` signal to the ones a hand-over moves onto a revision it runs (docs/design.md, "Upgrading the allocation
workflow").

    python -m workflows.allocation.retire               list the open runs that stand in the way, and why
    python -m workflows.allocation.retire --hand-over   also signal `hand_over` to those a hand-over moves

Run it from the release about to be deployed, against the namespace its workers will use, while the previous
release's workers still run: those answer the signals. It says for each open allocation run (the control queue's,
`BERTH_CONTROL_TASK_QUEUE`) whose revision is older than the code's oldest what must happen first, reading the
revision and how the run began from the run's first event, and exits 0 once nothing stands in the way, 1 before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecution

from config.settings import get_settings
from config.temporal import connect
from contracts.allocation import HOLDING_STATES
from workflows import search_attributes as sa
from workflows.allocation.messages import AllocationInput, HandOverRequest
from workflows.allocation.revisions import HOLD_UNCHANGED_SINCE, OLDEST, REVISION, retired

READS_AT_ONCE = 16  # first events read in parallel: the server's history service serves them


@dataclass(frozen=True)
class OpenRun:
    workflow_id: str
    run_id: str
    revision: int
    begun_as: str  # `request`, `hand-over` (a hold a hand-over started) or `hold at active` (revisions 2 and 3)
    state: str  # as the run last published it (`BerthState`)
    to_do: str  # what must happen before the code can run it; empty: nothing


def to_do(input: AllocationInput, state: str) -> str:
    """What must happen to a run before code whose oldest revision is `OLDEST` can run it ('' for nothing)."""
    if retired(input) is None:
        if input.revision < OLDEST and state not in HOLDING_STATES:
            return f"wait: it is {state or 'busy'} by revision {input.revision}'s steps"
        return ""
    if input.revision >= HOLD_UNCHANGED_SINCE:
        return "hand over" if state in HOLDING_STATES else "hand over (it does so once active)"
    return "end: a hold of revisions 2 and 3 ignores hand_over; released, cancelled or at its end"


def begun_as(input: AllocationInput) -> str:
    held = input.held
    if held is None:
        return "request"
    return "hand-over" if held.previous_run_id is not None else "hold at active"


async def open_runs(client: Client, control_queue: str) -> list[OpenRun]:
    """Every open allocation run on the control queue, with its revision and what it needs."""
    query = f"WorkflowType = 'Allocation' AND ExecutionStatus = 'Running' AND TaskQueue = '{control_queue}'"
    executions = [execution async for execution in client.list_workflows(query)]
    reads = asyncio.Semaphore(READS_AT_ONCE)

    async def read(execution: WorkflowExecution) -> OpenRun:
        async with reads:
            input = await started_with(client, execution)
        state = execution.typed_search_attributes.get(sa.STATE) or ""
        return OpenRun(execution.id, execution.run_id, input.revision, begun_as(input), state, to_do(input, state))

    return list(await asyncio.gather(*(read(execution) for execution in executions)))


async def started_with(client: Client, execution: WorkflowExecution) -> AllocationInput:
    """The input a run was started with: its revision and, for a hold, what it took over."""
    handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
    first: HistoryEvent | None = None
    async for event in handle.fetch_history_events(page_size=1):
        first = event
        break
    assert first is not None and first.HasField("workflow_execution_started_event_attributes")
    payloads = first.workflow_execution_started_event_attributes.input.payloads
    [input] = await client.data_converter.decode(payloads, [AllocationInput])
    return input


async def hand_over(client: Client, runs: list[OpenRun], reason: str) -> int:
    """Signal `hand_over` to each run a hand-over moves; the number signalled."""
    moved = [run for run in runs if run.to_do.startswith("hand over")]
    for run in moved:
        await client.get_workflow_handle(run.workflow_id).signal("hand_over", HandOverRequest(reason=reason))
    return len(moved)


def report(runs: list[OpenRun]) -> str:
    """The runs that stand in the way, one a line, then a line that says how many open runs there are."""
    waiting = [run for run in runs if run.to_do]
    lines = [f"{'WORKFLOW':<40} {'RUN':<36} {'REVISION':>8}  {'BEGUN AS':<14} {'STATE':<13} TO DO"] if waiting else []
    lines += [
        f"{r.workflow_id:<40} {r.run_id:<36} {r.revision:>8}  {r.begun_as:<14} {r.state:<13} {r.to_do}" for r in waiting
    ]
    lines.append(
        f"{len(runs)} open allocation runs; {len(waiting)} stand in the way of code that runs revisions "
        f"{OLDEST} and {REVISION}"
    )
    return "\n".join(lines)


async def main(arguments: argparse.Namespace) -> int:
    settings = get_settings()
    client = await connect(settings)
    runs = await open_runs(client, settings.control_task_queue)
    if arguments.hand_over:
        signalled = await hand_over(client, runs, arguments.reason)
        print(f"hand_over sent to {signalled} runs; run this again to see what is left")
        runs = await open_runs(client, settings.control_task_queue)
    print(report(runs))
    return 1 if any(run.to_do for run in runs) else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hand-over", action="store_true", help="signal hand_over to the runs a hand-over moves")
    parser.add_argument("--reason", default=f"an upgrade retires revisions before {OLDEST}")
    code = asyncio.run(main(parser.parse_args()))
    sys.stdout.flush()
    os._exit(code)  # a process that used a Temporal client can abort after it finished (sdk-python#300)
