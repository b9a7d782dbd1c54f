"""Every simulated node agent of a fleet file in one process: stands in, for benchmarks, for the GPU hosts that in
production run their agents on their own machines (so agent work does not compete with the control worker).

    python -m bench.agent_host FLEET STATE_DIR ADDRESS NODE_QUEUE_PREFIX [TOKEN_DIR]

Without TOKEN_DIR the agents poll Temporal at ADDRESS directly (how agents ran before the node gateway: the
benchmark's "before"); with it, ADDRESS is the node gateway and each host connects with its own token from
TOKEN_DIR/<node>, as `berth worker agents` does.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agent.serve import node_worker, simulated_agent
from config.worker_process import run_until_signalled
from fleet.loader import load_fleet


async def _client(address: str, token_dir: Path | None, node: str, shared: Client | None) -> Client:
    if token_dir is None:
        assert shared is not None
        return shared
    token = (token_dir / node).read_text().strip()
    return await Client.connect(address, data_converter=pydantic_data_converter, api_key=token, tls=False)


async def main(fleet_file: Path, state_dir: Path, address: str, prefix: str, token_dir: Path | None) -> None:
    shared = None if token_dir else await Client.connect(address, data_converter=pydantic_data_converter)
    nodes = [n.name for pool in load_fleet([fleet_file]).host_pools() for n in pool.nodes]
    clients = {node: await _client(address, token_dir, node, shared) for node in nodes}
    with ThreadPoolExecutor(max_workers=32) as executor:
        workers = [
            node_worker(clients[node], simulated_agent(fleet_file, node, state_dir), executor, f"{prefix}{node}")
            for node in nodes
        ]
        print("ready", flush=True)
        await run_until_signalled(workers)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    tokens = Path(arguments[4]) if len(arguments) > 4 else None
    asyncio.run(main(Path(arguments[0]), Path(arguments[1]), arguments[2], arguments[3], tokens))
