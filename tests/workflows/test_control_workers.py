"""Several control workers on one control task queue ("scaling out is Temporal's"), each with its own
inventory cache and its own placement state, deciding at once on a pool with room for two more GPUs: exactly two
requests are placed, the others are refused for want of capacity (never a claim conflict left unresolved), no slot
is ever claimed twice, and releasing everything gives every slot back. Which worker decides which request is
Temporal's to choose (the test does not force it): the outcome must hold whichever it is."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

import worker
from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client


async def test_three_control_workers_share_a_nearly_full_pool_without_a_double_claim(
    temporal_client, sessions, tmp_path: Path
) -> None:
    hosts = {f"n{n}": {"gpus": 4} for n in range(3)}
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts)) as lab:
        # Each worker has a client of its own, as a worker in another process or pod would.
        clients = [
            await Client.connect(
                temporal_client.service_client.config.target_host,
                namespace=temporal_client.namespace,
                data_converter=pydantic_data_converter,
            )
            for _ in range(2)
        ]
        others = [
            worker.control_worker(
                client,
                sessions,
                task_queue=lab.queues.control,
                clusters=worker.simulated_clusters(tmp_path / f"clusters-{n}"),
            )
            for n, client in enumerate(clients)
        ]
        running = [asyncio.create_task(w.run()) for w in others]
        try:
            held = [await lab.allocate(f"fill-{i}", gpus=2) for i in range(5)]  # 10 of 12 GPUs
            for handle in held:
                await lab.wait_for_state(handle, "active")
            rush = await asyncio.gather(*(lab.allocate(f"rush-{i}", gpus=1) for i in range(6)))
            ends = [await lab.wait_for_state(h, "active", "failed", timeout=60) for h in rush]
            active = [s for s in ends if s.state == "active"]
            assert len(active) == 2, [(s.allocation_id, s.state, s.failure_reason) for s in ends]
            for refused in (s for s in ends if s.state == "failed"):
                assert refused.failure_reason is not None
                assert refused.failure_reason.startswith(("insufficient_capacity", "sku_unavailable")), refused
            assert await lab.double_claims() == 0
            claims = await lab.active_claims()
            assert sum(len(slots) for slots in claims.values()) == 12
            for handle in [*held, *(h for h, s in zip(rush, ends, strict=True) if s.state == "active")]:
                await allocation_client.release(temporal_client, handle.id.removeprefix("allocation/"))
                assert (await handle.result()).state == "released"
            assert await lab.active_claims() == {} and await lab.available_slots() == 12
        finally:
            for w in others:
                await w.shutdown()
            await asyncio.gather(*running, return_exceptions=True)
