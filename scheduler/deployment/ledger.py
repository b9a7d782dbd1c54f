"""Rule 4: what each (cluster, pool) has left, so a scheduling pass never overcommits a pool.

A pool starts at its published node count. Every other deployment's replicas and this deployment's retained
replicas are charged at the cost they were stamped with when placed, on the pool each member is pinned to: a
retained replica keeps its old cost even if the spec has since grown, because its pods are what is running. This
deployment's dropped and scaled-down replicas are not charged: their nodes are being freed for the fill to reuse,
without which delete-then-create could never converge. A member pinned to a pool that no longer exists holds no
node and is charged nowhere.

Two kinds of charge share a pool. Modelplane's is a whole node per pod. GPU-level fit (`fitGranularity: Gpu`;
docs/seeds.md, "GPU-level fit") charges a pod only the GPUs it claims, on one node: the ledger then keeps those
nodes by number (0, 1, ...: names for the pool's nodes that hold GPU-level pods, not Kubernetes node names), with
the devices each has given out, and stamps the numbers on the replica (`berth.dev/member-gpus`) so the next pass
charges exactly the same nodes. A node holding GPU-level pods is never given out whole, and a whole node never
takes a GPU-level pod, so the free whole nodes are the published ones minus both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet.deployment import PlacementStrategy
from fleet.replica import ModelReplica, stamped_member_cost
from scheduler.deployment.pools import Pool

Usage = dict[int, dict[str, int]]  # node number -> device -> devices given out on that node


@dataclass(frozen=True)
class GpuPods:
    """The pods of one GPU-level member of an engine: each claims `count` of `device`, of `per_node` on a node."""

    member: int  # position in the engine
    label: str  # how a refusal names the member ("member 0 (Standalone)")
    device: str
    count: int
    per_node: int
    pods: int  # pods of every copy


@dataclass(frozen=True)
class MemberNodes:
    """Where the ledger put a GPU-level member's pods: the node number of each, in pod order."""

    member: int
    device: str
    count: int
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Charge:
    """What placing one engine on one pool takes, and what the pool has left afterwards for ranking pools."""

    nodes: int  # whole nodes
    gpus: tuple[MemberNodes, ...]
    left: int  # free whole nodes afterwards, or, for an engine with GPU-level members, free devices of their kind
    crowded: int = 0  # GPU-level pods put on nodes that already held other instances' pods
    room: int = 0  # the least room (free devices of the pod's kind) among those nodes, before the pods went there


class Ledger:
    def __init__(self, base: Ledger | None = None) -> None:
        self._whole: dict[tuple[str, str], int] = {}
        self._shared: dict[tuple[str, str], Usage] = {}  # copy-on-write over the base's
        self._base = base

    def whole(self, cluster: str, pool: str) -> int:
        own = self._whole.get((cluster, pool), 0)
        return own + self._base.whole(cluster, pool) if self._base is not None else own

    def shared(self, cluster: str, pool: str) -> Usage:
        """The pool's nodes holding GPU-level pods; read-only (charge through `apply`)."""
        found = self._shared.get((cluster, pool))
        if found is not None:
            return found
        return self._base.shared(cluster, pool) if self._base is not None else {}

    def free(self, pool: Pool) -> int:
        """Whole nodes free: published, less whole-node charges, less the nodes GPU-level pods hold."""
        return pool.nodes - self.whole(pool.cluster, pool.name) - len(self.shared(pool.cluster, pool.name))

    def charge(self, cluster: str, pool: str, nodes: int) -> None:
        if nodes:
            self._whole[(cluster, pool)] = self._whole.get((cluster, pool), 0) + nodes

    def give(self, cluster: str, pool: str, node: int, device: str, count: int) -> None:
        usage = self._own_shared(cluster, pool)
        held = usage.setdefault(node, {})
        held[device] = held.get(device, 0) + count

    def apply(self, pool: Pool, charge: Charge) -> None:
        self.charge(pool.cluster, pool.name, charge.nodes)
        for member in charge.gpus:
            for node in member.nodes:
                self.give(pool.cluster, pool.name, node, member.device, member.count)

    def fork(self) -> Ledger:
        """A ledger that starts where this one is and charges on its own: for trying a placement without touching
        this one (`engines.py`, `together.py`), at the cost of the charges made, not of copying every pool's."""
        return Ledger(base=self)

    def _own_shared(self, cluster: str, pool: str) -> Usage:
        key = (cluster, pool)
        if key not in self._shared:
            self._shared[key] = {node: dict(held) for node, held in self.shared(cluster, pool).items()}
        return self._shared[key]

    def plan(
        self, pool: Pool, whole_nodes: int, gpus: tuple[GpuPods, ...], strategy: PlacementStrategy | None
    ) -> Charge | str:
        """What an engine costing `whole_nodes` plus the GPU-level `gpus` would take on `pool`, or why it does not
        fit (naming every node that holds GPU-level pods and what it has left)."""
        free = self.free(pool)
        if free < whole_nodes:
            return f"needs {whole_nodes} free node{'s' if whole_nodes != 1 else ''}, has {free}"
        free -= whole_nodes
        occupied = self.shared(pool.cluster, pool.name)
        usage = {node: dict(held) for node, held in occupied.items()}
        placed = []
        crowded, room = 0, None
        for member in gpus:
            nodes = []
            for pod in range(member.pods):
                node = _choose(usage, free, member, strategy)
                if node is None:
                    return _short(member, pod, usage)
                if node in occupied:
                    before = member.per_node - usage[node].get(member.device, 0)
                    crowded, room = crowded + 1, before if room is None else min(room, before)
                if node not in usage:
                    usage[node] = {}
                    free -= 1
                usage[node][member.device] = usage[node].get(member.device, 0) + member.count
                nodes.append(node)
            placed.append(MemberNodes(member.member, member.device, member.count, tuple(nodes)))
        if gpus:
            first = gpus[0]
            left = free * first.per_node + sum(first.per_node - held.get(first.device, 0) for held in usage.values())
        else:
            left = free
        return Charge(
            nodes=whole_nodes, gpus=tuple(placed), left=left, crowded=crowded, room=room if room is not None else 0
        )


def _choose(usage: Usage, free: int, pods: GpuPods, strategy: PlacementStrategy | None) -> int | None:
    """The node for one pod. binpack: the shared node left with the least room that still fits, else a fresh node;
    spread: a fresh node, else the shared node with the most room; unset: the lowest-numbered node that fits, a
    fresh one taking the lowest unused number."""
    fresh = next(n for n in range(len(usage) + 1) if n not in usage) if free > 0 else None
    fitting = sorted(
        (pods.per_node - held.get(pods.device, 0), node)
        for node, held in usage.items()
        if pods.per_node - held.get(pods.device, 0) >= pods.count
    )
    if strategy is PlacementStrategy.BINPACK:
        return fitting[0][1] if fitting else fresh
    if strategy is PlacementStrategy.SPREAD:
        return fresh if fresh is not None else (max(fitting, key=lambda f: (f[0], -f[1]))[1] if fitting else None)
    candidates = [node for _, node in fitting] + ([fresh] if fresh is not None else [])
    return min(candidates, default=None)


def _short(pods: GpuPods, pod: int, usage: Usage) -> str:
    """Why the pod-th pod finds no node: every shared node's room, and that no node is wholly free."""
    needs = f"{pods.count} x {pods.device} on one node"
    where = "; ".join(
        f"node {node}: {max(pods.per_node - held.get(pods.device, 0), 0)} of {pods.per_node} free"
        + (f" ({held.get(pods.device, 0)} held by other instances)" if held.get(pods.device, 0) else "")
        for node, held in sorted(usage.items())
    )
    of = f" (pod {pod + 1} of {pods.pods})" if pods.pods > 1 else ""
    return f"{pods.label}{of} needs {needs}: " + (f"{where}; " if where else "") + "no node is wholly free"


def build_ledger(deployment: str, retained: Iterable[ModelReplica], replicas: Iterable[ModelReplica]) -> Ledger:
    ledger = Ledger()
    others = (r for r in replicas if r.deployment != deployment)
    for replica in (*others, *retained):
        cluster = replica.cluster
        if cluster is None:
            continue
        for engine in replica.spec.engines:
            for member in engine.members:
                if not member.node_pool_name:
                    continue
                if member.gpus is not None:
                    count = sum(r.count for r in member.device_requests)
                    for node in member.gpus.nodes:
                        ledger.give(cluster, member.node_pool_name, node, member.gpus.device, count)
                else:
                    ledger.charge(cluster, member.node_pool_name, stamped_member_cost(member, engine.copies))
    return ledger


def overcommitted(ledger: Ledger, pool: Pool, per_node: dict[str, int]) -> str | None:
    """Why `pool` is charged beyond what it has, or None: more nodes taken (whole, or holding GPU-level pods) than
    it publishes, or a node given more of a device than a node has (`per_node`, from the pool's class). The store's
    re-check under the pool's lock, so two deployments planning at once never both take the last GPUs."""
    shared = ledger.shared(pool.cluster, pool.name)
    whole = ledger.whole(pool.cluster, pool.name)
    if whole + len(shared) > pool.nodes:
        return (
            f"pool {pool.cluster}/{pool.name} has {pool.nodes} node(s): {whole} would be charged whole and "
            f"{len(shared)} would hold GPU-level pods"
        )
    for node, held in sorted(shared.items()):
        for device, count in sorted(held.items()):
            if count > per_node.get(device, 0):
                return (
                    f"node {node} of pool {pool.cluster}/{pool.name} would give out {count} x {device}; "
                    f"a node has {per_node.get(device, 0)}"
                )
    return None
