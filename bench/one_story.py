"""An allocation's time to `active` as the API reports it, and to a release sent at once after, with the hold in a run
of its own (revision 3: continue-as-new at `active`) and in the run that placed it (revision 4), in one run.

    python -m bench.one_story [--pairs 20]

Sequential 1-GPU allocations on an idle stack (PostgreSQL, the Temporal dev server, the control worker in this
process, the simulated hosts' agents in another behind the node gateway, as `bench.allocation` runs them), the two
revisions alternating one for one so both see the same machine. Each is started as the API starts it, then read
through `GET /v1/allocations/{id}` (the API in this process) every `--poll-ms` until it says `active`; the release is sent
through the API at once, and its answer timed. With the hold in its own run, Temporal keeps that run from starting
until `history.continueAsNewMinInterval` (1 s by default) after the placement run started: a read meanwhile falls
back to the row, and a release waits for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.actions import run_histories
from bench.polling import settled, until
from bench.stack import Request, Stack, api_in_process, run_workers, start
from bench.stats import percentile
from contracts.task_queues import Queues
from workflows.allocation import client as allocation_client
from workflows.allocation.revisions import HOLD_IN_PLACEMENT_RUN, REVISION

SLOW_MS = 500.0  # the second mode: an allocation that waited for the hold run


async def one(stack: Stack, api: httpx.AsyncClient, queues: Queues, revision: int, poll: float) -> dict[str, float]:
    allocation_id = f"story-{uuid.uuid4().hex[:10]}"
    started = time.perf_counter()
    await start(stack, queues, Request(allocation_id, "bench", 1), revision=revision)

    async def says_active() -> bool:
        response = await api.get(f"/v1/allocations/{allocation_id}")
        return response.status_code == 200 and response.json()["state"] == "active"

    await until(says_active, every=poll)
    active = 1000 * (time.perf_counter() - started)
    sent = time.perf_counter()
    response = await api.delete(f"/v1/allocations/{allocation_id}")
    assert response.status_code == 202, response.text
    release = 1000 * (time.perf_counter() - sent)
    await settled(stack.sessions, [allocation_id], ("released",), every=0.002, timeout=60)
    runs = len(await run_histories(stack.client, allocation_client.workflow_id(allocation_id)))
    return {"active": active, "release": release, "runs": runs}


def summary(samples: list[dict[str, float]], key: str) -> str:
    values = [s[key] for s in samples]
    return f"{statistics.median(values):.0f} | {percentile(values, 0.9):.0f} | {max(values):.0f}"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as home:
        stack = Stack(Path(home))
        try:
            await stack.connect()
            fleet_file = await stack.load_fleet(8)
            queues = Queues(control="story.control", node_prefix="story.node.")
            await run_workers(stack, fleet_file, queues)
            revisions = (HOLD_IN_PLACEMENT_RUN - 1, REVISION)
            samples: dict[int, list[dict[str, float]]] = {r: [] for r in revisions}
            async with api_in_process(stack, queues, "one-story") as api:
                for n in range(args.pairs + 1):  # the first pair warms both paths up and is not counted
                    for revision in revisions:
                        sample = await one(stack, api, queues, revision, args.poll_ms / 1000)
                        if n:
                            samples[revision].append(sample)
            print(
                f"\n{args.pairs} sequential 1-GPU allocations per revision, alternating, idle stack, read every "
                f"{args.poll_ms:g} ms (ms)\n"
            )
            print(
                "| revision | start -> GET says active: p50 / p90 / max | over 500 ms | release answered: p50 / p90 / max | over 500 ms | runs |"
            )
            print("|---|---:|---:|---:|---:|---:|")
            for revision, found in samples.items():
                slow = sum(1 for s in found if s["active"] > SLOW_MS)
                waited = sum(1 for s in found if s["release"] > SLOW_MS)
                runs = sorted({int(s["runs"]) for s in found})
                label = "hold in its own run" if revision < HOLD_IN_PLACEMENT_RUN else "hold in the placement run"
                print(
                    f"| {revision} ({label}) | {summary(found, 'active')} | {slow} of {len(found)} | "
                    f"{summary(found, 'release')} | {waited} of {len(found)} | {', '.join(map(str, runs))} |"
                )
        finally:
            await stack.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--poll-ms", type=float, default=5.0, help="how often the client reads the allocation")
    asyncio.run(main(parser.parse_args()))
