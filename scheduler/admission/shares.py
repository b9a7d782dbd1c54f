"""Shares of the fleet: the fleet's GPUs per product, what each tenant holds of them, and a tenant's weighted
dominant share of them. The admission pass uses them only to decide which nodes are held for a tenant's further
requests while they wait (`scheduler.admission.admit`); who is admitted first is Kueue's rule (`scheduler.quota.fair_sharing`
where a cohort tree shares fairly)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from contracts.vocabulary import PoolShape
from scheduler.snapshot import Snapshot

Usage = dict[str, dict[str, int]]  # tenant -> GPU product (casefolded) -> GPUs held


def capacity_by_product(snapshot: Snapshot) -> dict[str, int]:
    """The fleet's GPUs per product (casefolded), slices and bare metal alike: what fair shares are shares of."""
    capacity: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    for pool in snapshot.pools:
        if pool.shape is PoolShape.KUBERNETES or not pool.gpu_product:
            continue
        for name in pool.nodes:
            if name not in seen:
                seen.add(name)
                capacity[pool.gpu_product.casefold()] += len(snapshot.nodes[name].slots)
    return dict(capacity)


def product_of(snapshot: Snapshot, node: str) -> str | None:
    """The GPU product (casefolded) of the node's pool: what its GPUs count towards in shares."""
    return next((p.gpu_product.casefold() for p in snapshot.pools_of(node) if p.gpu_product), None)


def usage_by_product(snapshot: Snapshot, holdings: Iterable[tuple[str, str, int]]) -> Usage:
    """tenant -> product -> GPUs, from (tenant, node, GPUs) of the allocations holding or planning GPUs on a node."""
    usage: Usage = defaultdict(lambda: defaultdict(int))
    for tenant, node, gpus in holdings:
        product = product_of(snapshot, node)
        if product is not None:
            usage[tenant][product] += gpus
    return usage


def dominant_share(used: Mapping[str, int], capacity: Mapping[str, int], weight: float) -> float:
    shares = [gpus / capacity[product] for product, gpus in used.items() if capacity.get(product)]
    return max(shares, default=0.0) / weight
