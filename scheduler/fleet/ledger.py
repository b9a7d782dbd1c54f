"""Rule 4: free nodes per (cluster, pool), so a scheduling pass never overcommits a pool.

A pool starts at its published node count. Every other deployment's replicas and this deployment's retained
replicas are charged at the cost they were stamped with when placed, on the pool each member is pinned to: a
retained replica keeps its old cost even if the spec has since grown, because its pods are what is running. This
deployment's dropped and scaled-down replicas are not charged: their nodes are being freed for the fill to reuse,
without which delete-then-create could never converge. A member pinned to a pool that no longer exists holds no
node and is charged nowhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleet.replica import ModelReplica, stamped_member_cost
from scheduler.fleet.pools import Pool


class Ledger:
    def __init__(self, charged: dict[tuple[str, str], int], base: Ledger | None = None) -> None:
        self._charged = charged
        self._base = base

    def used(self, cluster: str, pool: str) -> int:
        own = self._charged.get((cluster, pool), 0)
        return own + self._base.used(cluster, pool) if self._base is not None else own

    def free(self, pool: Pool) -> int:
        own = self._charged.get((pool.cluster, pool.name), 0)  # inlined: the fill asks this for every pool it tries
        if self._base is None:
            return pool.nodes - own
        return pool.nodes - own - self._base.used(pool.cluster, pool.name)

    def charge(self, cluster: str, pool: str, nodes: int) -> None:
        if nodes:
            self._charged[(cluster, pool)] = self._charged.get((cluster, pool), 0) + nodes

    def fork(self) -> Ledger:
        """A ledger that starts where this one is and charges on its own: for trying a cluster without touching
        this one (`together.py`), at the cost of the charges made, not of copying every pool's."""
        return Ledger({}, base=self)


def build_ledger(deployment: str, retained: Iterable[ModelReplica], replicas: Iterable[ModelReplica]) -> Ledger:
    ledger = Ledger({})
    others = (r for r in replicas if r.deployment != deployment)
    for replica in (*others, *retained):
        cluster = replica.cluster
        if cluster is None:
            continue
        for engine in replica.spec.engines:
            for member in engine.members:
                if member.node_pool_name:
                    ledger.charge(cluster, member.node_pool_name, stamped_member_cost(member, engine.copies))
    return ledger
