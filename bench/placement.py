"""Placement benchmark: one 2-GPU slice placement over synthetic fleets of 100 to 50,000 8-GPU nodes.

    python -m bench.placement [--runs N] [--sizes 100,1000,10000,50000]

The fleets are partly used, the way a busy fleet is: per node a random number of claimed slots, some leases and
quarantined slots, a few nodes not READY and a few with a shared parent fabric device, pools of 250 nodes split
over two regions and two InferenceClasses. The request names a tenant and a DRA CEL selector, so every level
runs. Reported per size: snapshot build time (views -> Snapshot: profiles, groups, CEL devices), the time to
update a snapshot for one changed node (`with_nodes`), the median and 95th percentile of one full `schedule()`
pass, the median with per-item detail (the explain endpoint), and CEL evaluations against the distinct
(selector, device) pairs they must equal.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from bench.stats import timed_ms
from contracts.placement import PlacementRequest
from contracts.vocabulary import NodeStatus, PoolShape, SlotState
from fleet.node import FabricClaimMode
from fleet.region import RegionStatus
from scheduler import cel
from scheduler.placement.schedule import schedule
from scheduler.snapshot import Snapshot
from scheduler.views import NodeView, PoolView, RegionView, SlotView, TenantView

SIZES = (100, 1_000, 10_000, 50_000)
NODES_PER_POOL = 250
GPUS_PER_NODE = 8
SELECTOR = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("64Gi")) >= 0'


@dataclass(frozen=True)
class Busyness:
    """How busy a synthetic host is, as chances: a shared fabric parent, a claimed slot leased instead, a free slot
    quarantined, the node not READY (down or cordoned), its agent silent."""

    shared: float = 0.03
    leased: float = 0.05
    quarantined: float = 0.01
    not_ready: float = 0.02
    agent_silent: float = 0.0


def synthetic_node(name: str, rng: random.Random, busy: Busyness = Busyness()) -> NodeView:
    """A partly used 8-GPU host: a random number of claimed slots, then the chances in `busy`."""
    shared = rng.random() < busy.shared
    claimed = rng.choice([0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    slots = []
    for index in range(GPUS_PER_NODE):
        state, holder = SlotState.FREE, None
        if index < claimed:
            state, holder = SlotState.CLAIMED, f"alloc-{name}-{index // 2}"
            if rng.random() < busy.leased:
                state = SlotState.LEASED
        elif rng.random() < busy.quarantined:
            state = SlotState.QUARANTINED
        slots.append(
            SlotView(
                id=f"{name}/{index}",
                index=index,
                approved=True,
                fabric_claim_mode=FabricClaimMode.SHARED_PARENT if shared else FabricClaimMode.PER_SLOT_VF,
                fabric_vf_pci=None if shared else f"0000:{0x1A + index:02x}:00.2",
                numa_node=index // 4,
                state=state,
                holder=holder,
                gpu_pci=f"0000:{0x3C + index:02x}:00.0",
                nvme_device=f"/dev/disk/by-id/nvme-{name}-{index}",
                vcpus=24,
                memory_mib=131072,
            )
        )
    ready = rng.random() >= busy.not_ready
    status = NodeStatus.READY if ready else rng.choice([NodeStatus.DOWN, NodeStatus.CORDONED])
    live = rng.random() >= busy.agent_silent if busy.agent_silent else True
    return NodeView(name=name, status=status, slots=tuple(slots), numa_nodes=2, agent_live=live)


def synthetic_views(nodes: int, seed: int = 7) -> dict[str, list]:
    """Views for a fleet of `nodes` hosts. Each size's devices carry the size, so CEL work is counted per size."""
    rng = random.Random(seed)
    devices = {
        product: {
            "name": "gpu",
            "driver": "gpu.nvidia.com",
            "attributes": {"productName": {"string": f"NVIDIA {product}"}, "fleetSize": {"int": nodes}},
            "capacity": {"memory": {"value": memory}},
        }
        for product, memory in (("H200", "141Gi"), ("H100", "80Gi"))
    }
    pools, hosts = [], []
    for p in range(max(1, nodes // NODES_PER_POOL)):
        names = [f"p{p:02d}-n{n:04d}" for n in range(min(NODES_PER_POOL, nodes))]
        hosts.extend(synthetic_node(name, rng) for name in names)
        product = "H200" if p % 2 == 0 else "H100"
        pools.append(
            PoolView(
                cluster=f"cluster-{p // 4:02d}",
                name=f"pool-{p % 4}",
                region="us-east" if p % 4 < 2 else "us-west",
                shape=PoolShape.GPU_SLICE,
                gpu_product=product,
                nodes=tuple(names),
                devices=(devices[product],),
            )
        )
    regions = [
        RegionView(name="us-east", status=RegionStatus.AVAILABLE, prices={"H200": 3.49, "H100": 2.49}),
        RegionView(name="us-west", status=RegionStatus.AVAILABLE, prices={"H200": 3.29, "H100": 2.29}),
    ]
    tenants = [TenantView(name="acme", gpu_quota=10**6, active_gpus=1200, in_flight_gpus=16)]
    return {"regions": regions, "pools": pools, "nodes": hosts, "tenants": tenants}


def measure(nodes: int, runs: int) -> dict[str, float | int]:
    views = synthetic_views(nodes)
    build = min(timed_ms(lambda: Snapshot(**views), 3))
    snapshot = Snapshot(**views)
    some_node = views["nodes"][len(views["nodes"]) // 2]
    update = statistics.median(timed_ms(lambda: snapshot.with_nodes([some_node]), 20))
    request = PlacementRequest(gpu_count=2, tenant="acme", selectors=[SELECTOR])
    before = cel.evaluation_count()
    first = schedule(snapshot, request)
    assert first.placed, first.explanation.summary
    plain = timed_ms(lambda: schedule(snapshot, request), runs)
    detailed = timed_ms(lambda: schedule(snapshot, request, detail=True), max(5, runs // 20))
    evaluations = cel.evaluation_count() - before
    region_pools = snapshot.pools_in(first.region or "")
    pairs = len(request.selectors) * len({str(pool.devices[0]) for pool in region_pools})
    return {
        "nodes": nodes,
        "pools": len(snapshot.pools),
        "node groups": sum(len(snapshot.groups(pool)) for pool in snapshot.pools),
        "build ms": build,
        "1-node update ms": update,
        "median ms": statistics.median(plain),
        "p95 ms": statistics.quantiles(plain, n=20)[-1],
        "detail median ms": statistics.median(detailed),
        "CEL evaluations": evaluations,
        "(selector, device) pairs": pairs,
    }


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"fleet sizes must be positive integers, got {text!r}")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="placements timed per fleet size")
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=",".join(str(size) for size in SIZES),
        help="fleet sizes in nodes, a comma list (default: %(default)s)",
    )
    args = parser.parse_args()
    rows = [measure(nodes, args.runs) for nodes in args.sizes]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---:" for _ in columns) + "|")
    for row in rows:
        cells = [f"{value:,.3f}" if isinstance(value, float) else f"{value:,}" for value in row.values()]
        print("| " + " | ".join(cells) + " |")
    base = next((row for row in rows if row["nodes"] == 100), rows[0])
    largest = max(rows, key=lambda row: row["nodes"])
    ratio = largest["median ms"] / base["median ms"]
    print(f"median at {largest['nodes']:,} nodes / median at {base['nodes']:,} nodes: {ratio:.2f}x")


if __name__ == "__main__":
    main()
