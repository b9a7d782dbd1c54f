"""One control worker in its own process, for the benchmarks that run several (`bench.allocation --control-workers`):
production runs each control worker as its own process (its own event loop, core, Temporal client and inventory
cache), so several in one benchmark process would share one core and prove nothing.

    python -m bench.control_host DATABASE_URL TEMPORAL_ADDRESS CONTROL_QUEUE TIMES_FILE

Prints "ready" once the worker polls; on SIGTERM it shuts down and writes the region lock's times as this process
saw them (`activities.control.placement.LOCK_TIMES`, by `lock_times`) to TIMES_FILE as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

import worker
from activities.control.placement import LOCK_TIMES
from config.worker_process import run_until_signalled
from store.db import create_engine, session_factory


async def main(database_url: str, address: str, task_queue: str, times_file: Path) -> None:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    engine = create_engine(database_url, pool_size=20)
    try:
        control = worker.control_worker(client, session_factory(engine), task_queue)
        await run_until_signalled([control], ready=lambda: print("ready", flush=True))
    finally:
        await engine.dispose()
    times_file.write_text(json.dumps(lock_times()))


def lock_times() -> dict[str, Any]:
    """The region lock's times as this process saw them, as JSON goes: what each control worker process reports on
    its way out, and what `bench.allocation` reads of the one in its own process."""
    return {
        "held": list(LOCK_TIMES.held),
        "waited": list(LOCK_TIMES.waited),
        "fast_refusals": LOCK_TIMES.fast_refusals,
        "moved": LOCK_TIMES.moved,
        "unchecked": LOCK_TIMES.unchecked,
    }


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
