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

from api.app import create_app
from bench.actions import run_histories
from bench.allocation import FAST, Stack, _row_state, _run_workers
from contracts.task_queues import Queues
from scheduler.request import PlacementRequest
from store.tokens import create_token
from workflows import allocation_client
from workflows.allocation_messages import HOLD_IN_PLACEMENT_RUN, REVISION, AllocationInput

SLOW_MS = 500.0  # the second mode: an allocation that waited for the hold run


async def one(
    stack: Stack, api: httpx.AsyncClient, headers: dict[str, str], queues: Queues, revision: int, poll: float
) -> dict[str, float]:
    allocation_id = f"story-{uuid.uuid4().hex[:10]}"
    request = PlacementRequest(gpu_count=1, tenant="bench")
    input = AllocationInput(allocation_id=allocation_id, tenant="bench", request=request, timing=FAST, queues=queues)
    started = time.perf_counter()
    await allocation_client.start_allocation(stack.client, input, revision=revision)
    while True:
        response = await api.get(f"/v1/allocations/{allocation_id}", headers=headers)
        if response.status_code == 200 and response.json()["state"] == "active":
            break
        await asyncio.sleep(poll)
    active = 1000 * (time.perf_counter() - started)
    sent = time.perf_counter()
    response = await api.delete(f"/v1/allocations/{allocation_id}", headers=headers)
    assert response.status_code == 202, response.text
    release = 1000 * (time.perf_counter() - sent)
    await _row_state(stack, allocation_id, "released")
    runs = len(await run_histories(stack.client, allocation_client.workflow_id(allocation_id)))
    return {"active": active, "release": release, "runs": runs}


def summary(samples: list[dict[str, float]], key: str) -> str:
    values = sorted(s[key] for s in samples)
    return f"{statistics.median(values):.0f} | {values[int(0.9 * (len(values) - 1))]:.0f} | {values[-1]:.0f}"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as home:
        stack = Stack(Path(home))
        try:
            await stack.connect()
            fleet_file = await stack.load_fleet(8)
            queues = Queues(control="story.control", node_prefix="story.node.")
            await _run_workers(stack, fleet_file, queues)
            async with stack.sessions.begin() as session:
                token = await create_token(session, "member", tenant="bench", label="one-story")
            app = create_app(sessions=stack.sessions, temporal=stack.client, queues=queues, timing=FAST)
            while await app.state.services.control.control_workers() == 0:
                await asyncio.sleep(0.05)
            headers = {"Authorization": f"Bearer {token}"}
            revisions = (HOLD_IN_PLACEMENT_RUN - 1, REVISION)
            samples: dict[int, list[dict[str, float]]] = {r: [] for r in revisions}
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://berth", timeout=60) as api:
                for n in range(args.pairs + 1):  # the first pair warms both paths up and is not counted
                    for revision in revisions:
                        sample = await one(stack, api, headers, queues, revision, args.poll_ms / 1000)
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
