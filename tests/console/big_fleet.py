"""A big fleet, built fast, for what the console must draw at scale: `regions` regions of `pools` pools each, of 8-GPU
H200 hosts (10,000 nodes in all by default), applied as one fleet file (`nodeTemplate` pools, `store.apply`), then
brought to life with a few bulk statements instead of 10,000 agents' reports: every agent live for a day, every
slot validated, and a spread of states to draw (a node in 97 cordoned, one in 89 draining, one slot in 41 failed, one
in 53 degraded, one in 67 quarantined).

    timings = await build_big_fleet(sessions)         # {"apply": s, "live": s, "nodes": 10000, "gpus": 80000}

About 40 s for the apply and 6 s for the rest at 10,000 nodes (the test in test_fleet_pages.py prints both).
A browser test signs in with an admin token made by `store.tokens.create_token(session, "admin")` and opens
`/console/fleet` (pools `c-<region>/p<n>`, regions `r1`, `r2`, ...).
"""

from __future__ import annotations

import time
from typing import Any

import yaml
from sqlalchemy import text

from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.db import AsyncSession, async_sessionmaker

BERTH = "berth.dev/v1alpha1"


def big_fleet_text(nodes: int = 10_000, regions: int = 2, pools: int = 5, gpus: int = 8) -> str:
    """The fleet file: nodes spread evenly over regions × pools, named `<region>-p<pool>-<index>`."""
    per_pool = nodes // (regions * pools)
    documents: list[dict[str, Any]] = [
        {"apiVersion": BERTH, "kind": "Tenant", "metadata": {"name": "acme"}, "spec": {"gpuQuota": 10**6}},
        {
            "apiVersion": "modelplane.ai/v1alpha1",
            "kind": "InferenceClass",
            "metadata": {"name": "h200"},
            "spec": {"devices": [{"name": "gpu", "driver": "gpu.nvidia.com", "count": gpus}]},
        },
    ]
    for r in range(1, regions + 1):
        region = f"r{r}"
        documents.append(
            {"apiVersion": BERTH, "kind": "Region", "metadata": {"name": region}, "spec": {"prices": {"H200": 3.0}}}
        )
        node_pools = [
            {
                "name": f"p{p}",
                "className": "h200",
                "shape": "gpu_slice",
                "gpuProduct": "H200",
                "nodeTemplate": {
                    "count": per_pool,
                    "namePrefix": f"{region}-p{p}-",
                    "gpusPerNode": gpus,
                    "numaNodes": 2,
                },
            }
            for p in range(pools)
        ]
        documents.append(
            {
                "apiVersion": BERTH,
                "kind": "InferenceCluster",
                "metadata": {"name": f"c-{region}"},
                "spec": {"region": region, "nodePools": node_pools},
            }
        )
    return yaml.safe_dump_all(documents, sort_keys=False)


_LIVE = [
    "INSERT INTO node_agents (node, state, seen_at, expires_at, interval_seconds) "
    "SELECT name, 'live', now(), now() + interval '1 day', 30 FROM nodes ON CONFLICT (node) DO NOTHING",
    "UPDATE node_resource_slots SET validation = 'valid', validated_at = now()",
    "UPDATE nodes SET status = 'CORDONED' WHERE abs(hashtext(name)) % 97 = 0",
    "UPDATE nodes SET status = 'DRAINING' WHERE abs(hashtext(name)) % 89 = 0",
    "UPDATE node_resource_slots SET health = 'failed', health_reason = 'Xid 79: GPU has fallen off the bus', "
    "health_reasons = '[\"Xid 79: GPU has fallen off the bus\"]', health_at = now() WHERE id % 41 = 0",
    "UPDATE node_resource_slots SET health = 'degraded', health_reason = 'correctable AER errors', "
    "health_reasons = '[\"correctable AER errors\"]', health_at = now() WHERE id % 53 = 0 AND health = 'healthy'",
    "UPDATE node_resource_slots SET state = 'quarantined', quarantine_reason = 'wipe not confirmed' WHERE id % 67 = 0",
]


async def build_big_fleet(
    sessions: async_sessionmaker[AsyncSession], nodes: int = 10_000, regions: int = 2, pools: int = 5
) -> dict[str, float]:
    """Apply the big fleet to the (migrated, empty) database and bring it to life; how long each part took."""
    started = time.perf_counter()
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("big.yaml", big_fleet_text(nodes, regions, pools))]), prune=True)
    applied = time.perf_counter()
    async with sessions.begin() as session:
        for statement in _LIVE:
            await session.execute(text(statement))
        counted = (await session.execute(text("SELECT count(*) FROM node_resource_slots"))).scalar_one()
    return {
        "apply": round(applied - started, 2),
        "live": round(time.perf_counter() - applied, 2),
        "nodes": float(nodes),
        "gpus": float(counted),
    }
