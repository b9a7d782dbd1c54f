"""Every simulated node agent of a fleet file in one process: stands in, for benchmarks, for the GPU hosts that in
production run their agents on their own machines (so agent work does not compete with the control worker).

    python -m bench.agent_host FLEET STATE_DIR TEMPORAL_ADDRESS NODE_QUEUE_PREFIX
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.node.serve import node_worker, simulated_agent
from activities.serving import run_until_signalled
from fleet.loader import load_fleet


async def main(fleet_file: Path, state_dir: Path, address: str, prefix: str) -> None:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    nodes = [n.name for pool in load_fleet([fleet_file]).host_pools() for n in pool.nodes]
    with ThreadPoolExecutor(max_workers=32) as executor:
        workers = [
            node_worker(client, simulated_agent(fleet_file, node, state_dir), executor, f"{prefix}{node}")
            for node in nodes
        ]
        print("ready", flush=True)
        await run_until_signalled(workers)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
