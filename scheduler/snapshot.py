"""An inventory snapshot: the read-only world the cluster scheduler and the capacity surfaces decide over.

Building one (the data types are in `scheduler.views`):

    Snapshot(
        regions=[RegionView(...)],
        pools=[PoolView(..., nodes=("h01", "h02"))],     # a pool names its nodes
        nodes=[NodeView(name="h01", status=..., slots=(SlotView(...), ...))],
        tenants=[TenantView(...)],                        # policy plus current usage
    )

The constructor does the per-snapshot work once: each node's profile (its compatible free bundle counts, overall
and per NUMA node), per pool its nodes grouped by identical profile, and each pool's devices in CEL form.
Placement then judges and ranks groups, not nodes, and computes each verdict once per distinct profile (about a
hundred in a busy 10,000-node fleet). `with_nodes` updates a snapshot for changed nodes only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.compatibility import NodeProfile, profile_of
from scheduler.views import NodeView, PoolView, RegionView, TenantView

if TYPE_CHECKING:  # the CEL stack (celpy, lark, re2) is 10 MB that node agents, which plan bundles, never use
    from scheduler.cel import Device


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Nodes of one pool that share a profile, and therefore a verdict and a score for any request."""

    profile: NodeProfile
    key: int  # the profile's number in this snapshot: per-request memos index by it instead of hashing profiles
    nodes: tuple[str, ...]  # sorted by name


class Snapshot:
    """Read-only after construction; see the module docstring for how to build one."""

    __slots__ = (
        "regions",
        "tenants",
        "nodes",
        "pools",
        "_keys",
        "_node_keys",
        "_groups",
        "_devices",
        "_by_region",
        "_pools_of",
    )

    def __init__(
        self,
        *,
        regions: Iterable[RegionView],
        pools: Iterable[PoolView],
        nodes: Iterable[NodeView],
        tenants: Iterable[TenantView] = (),
    ) -> None:
        self.regions: dict[str, RegionView] = {r.name: r for r in sorted(regions, key=lambda r: r.name)}
        self.tenants: dict[str, TenantView] = {t.name: t for t in tenants}
        self.nodes: dict[str, NodeView] = {n.name: n for n in nodes}
        self.pools: tuple[PoolView, ...] = tuple(sorted(pools, key=lambda p: p.key))
        self._keys: dict[NodeProfile, int] = {}  # distinct profiles, numbered
        self._node_keys: dict[str, int] = {name: self._key(profile_of(node)) for name, node in self.nodes.items()}
        self._groups: dict[str, tuple[NodeGroup, ...]] = {}
        self._devices: dict[str, tuple[Device | Mapping[str, object], ...]] = {}
        self._by_region: dict[str, list[PoolView]] = {}
        self._pools_of: dict[str, list[PoolView]] = {}
        for pool in self.pools:
            missing = [name for name in pool.nodes if name not in self.nodes]
            if missing:
                raise ValueError(f"pool {pool.key} names nodes that are not in the snapshot: {', '.join(missing)}")
            self._groups[pool.key] = self._group(pool)
            self._devices[pool.key] = tuple(_prepared(device) for device in pool.devices)
            self._by_region.setdefault(pool.region, []).append(pool)
            for name in pool.nodes:
                self._pools_of.setdefault(name, []).append(pool)

    def with_nodes(self, nodes: Iterable[NodeView]) -> Snapshot:
        """A snapshot with these nodes' status and slots replaced, sharing everything else with this one.

        For keeping a snapshot current between scheduling passes (a claim recorded, a lease expired, a node
        cordoned) at the cost of the changed nodes and their pools, instead of rebuilding all of it. Nodes keep
        their pools; a node this snapshot does not hold is an error.
        """
        changed = {node.name: node for node in nodes}
        unknown = sorted(set(changed) - set(self.nodes))
        if unknown:
            raise ValueError(f"nodes not in the snapshot: {', '.join(unknown)}")
        new = object.__new__(Snapshot)
        new.regions, new.tenants, new.pools = self.regions, self.tenants, self.pools
        new._devices, new._by_region, new._pools_of = self._devices, self._by_region, self._pools_of
        new.nodes = {**self.nodes, **changed}
        new._keys = dict(self._keys)
        new._node_keys = {**self._node_keys, **{name: new._key(profile_of(node)) for name, node in changed.items()}}
        new._groups = dict(self._groups)
        for pool in {pool.key: pool for name in changed for pool in self.pools_of(name)}.values():
            new._groups[pool.key] = new._group(pool)
        return new

    def with_tenants(self, tenants: Iterable[TenantView]) -> Snapshot:
        """A snapshot with these tenants (policy and current usage), sharing everything else with this one."""
        new = object.__new__(Snapshot)
        for name in Snapshot.__slots__:
            setattr(new, name, getattr(self, name))
        new.tenants = {t.name: t for t in tenants}
        return new

    def within(self, regions: Iterable[str]) -> Snapshot:
        """This snapshot cut down to `regions`, their pools and those pools' nodes, sharing profiles and groups with
        this one: the fleet as a tenant may use it (`scheduler.tenant_scope`), so nothing it is shown names or counts
        a region, pool or node it may not use. This snapshot itself when it holds no other region (most tenants):
        a view costs O(nodes kept): 1.8 ms at 5,000 of 10,000 nodes, as much as one placement (bench/tenant_view.py)."""
        wanted = set(regions)
        if wanted.issuperset(self.regions):
            return self
        new = object.__new__(Snapshot)
        for name in Snapshot.__slots__:
            setattr(new, name, getattr(self, name))
        new.regions = {name: region for name, region in self.regions.items() if name in wanted}
        new.pools = tuple(pool for pool in self.pools if pool.region in new.regions)
        pools_of = {name: [pool] for pool in new.pools for name in pool.nodes}
        if len(pools_of) < sum(len(pool.nodes) for pool in new.pools):  # a node in several pools (rare)
            pools_of = {name: [p for p in self._pools_of[name] if p.region in new.regions] for name in pools_of}
        new._pools_of = pools_of
        new.nodes = {name: node for name, node in self.nodes.items() if name in pools_of}
        new._node_keys = {name: self._node_keys[name] for name in new.nodes}
        new._groups = {pool.key: self._groups[pool.key] for pool in new.pools}
        new._devices = {pool.key: self._devices[pool.key] for pool in new.pools}
        new._by_region = {name: pools for name, pools in self._by_region.items() if name in new.regions}
        return new

    def _key(self, profile: NodeProfile) -> int:
        return self._keys.setdefault(profile, len(self._keys))

    def _group(self, pool: PoolView) -> tuple[NodeGroup, ...]:
        profiles = list(self._keys)
        by_key: dict[int, list[str]] = {}
        for name in sorted(pool.nodes):
            by_key.setdefault(self._node_keys[name], []).append(name)
        return tuple(NodeGroup(profiles[key], key, tuple(members)) for key, members in by_key.items())

    def pools_in(self, region: str) -> list[PoolView]:
        return self._by_region.get(region, [])

    def pools_of(self, node: str) -> list[PoolView]:
        return self._pools_of.get(node, [])

    def groups(self, pool: PoolView) -> tuple[NodeGroup, ...]:
        return self._groups[pool.key]

    def profile_key(self, node: str) -> int:
        return self._node_keys[node]

    def devices(self, pool: PoolView) -> tuple[Device | Mapping[str, object], ...]:
        """The pool's GPU devices, converted for CEL once per snapshot rather than once per request."""
        return self._devices[pool.key]


def _prepared(device: Mapping[str, object]) -> Device | Mapping[str, object]:
    """A malformed device stays as published: selectors then fail on it, per pool, with the device's fault."""
    from scheduler.cel import DeviceError, prepare_device

    try:
        return prepare_device(device)
    except DeviceError:
        return device
