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

So that one decision costs about the same on 100 or 50,000 nodes, the constructor also sorts each region's pools
into **pool classes** (`PoolClass`: pools every pool filter treats alike, so the pool level judges a class once) and
keeps, per class, how many of its nodes have each profile (`profile_counts`). The node level's counts, and a
region's room, are sums over those few classes and ~150 profiles instead of over every node group; `memo` keeps what
a request of one kind derives from a class's counts, for this snapshot. `with_nodes` updates the counts of the
changed nodes' classes only, and keeps the memo of every other class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from scheduler.compatibility import NodeProfile, profile_of
from scheduler.views import CohortView, NodeView, PoolView, RegionView, TenantView

if TYPE_CHECKING:  # the CEL stack (celpy, lark, re2) is 10 MB that node agents, which plan bundles, never use
    from scheduler.cel import Device

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PoolClass:
    """Pools of one region that every pool filter (`scheduler.placement.pools`) judges alike, for any request: the same shape,
    GPU product, cluster labels and readiness, longest lease, and devices by content. The pool level judges
    `pool`, the first of them, for all of them."""

    id: int  # its number in this snapshot: memos index by it
    pool: PoolView  # the first, in snapshot order
    pools: tuple[PoolView, ...]  # in snapshot order


@dataclass(frozen=True, slots=True)
class Postings:
    """Where a pool class's nodes of one profile are: the positions (in `pools_in(region)`) of the pools holding
    some, ascending, and the running count of those nodes (`ends[i]`: in the first i of those pools)."""

    positions: tuple[int, ...]
    ends: tuple[int, ...]  # one longer than positions, from 0


_REPOST_LIMIT = 16  # profiles of one class changed in one update past which its postings are laid out anew


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
        "cohorts",
        "nodes",
        "pools",
        "_keys",
        "_node_keys",
        "_groups",
        "_devices",
        "_by_region",
        "_pools_of",
        "_profiles",
        "_group_at",
        "_classes",
        "_class_of",
        "_counts",
        "_position",
        "_postings",
        "_memo",
        "_profile_memo",
        "_trees",
    )

    def __init__(
        self,
        *,
        regions: Iterable[RegionView],
        pools: Iterable[PoolView],
        nodes: Iterable[NodeView],
        tenants: Iterable[TenantView] = (),
        cohorts: Iterable[CohortView] = (),
    ) -> None:
        self.regions: dict[str, RegionView] = {r.name: r for r in sorted(regions, key=lambda r: r.name)}
        self.tenants: dict[str, TenantView] = {t.name: t for t in tenants}
        self.cohorts: dict[str, CohortView] = {c.name: c for c in cohorts}  # Cohort objects (scheduler.quota.cohorts)
        self.nodes: dict[str, NodeView] = {n.name: n for n in nodes}
        self.pools: tuple[PoolView, ...] = tuple(sorted(pools, key=lambda p: p.key))
        self._keys: dict[NodeProfile, int] = {}  # distinct profiles, numbered
        self._profiles: list[NodeProfile] = []  # by number
        self._node_keys: dict[str, int] = {name: self._key(profile_of(node)) for name, node in self.nodes.items()}
        self._groups: dict[str, tuple[NodeGroup, ...]] = {}
        self._group_at: dict[str, dict[int, int]] = {}  # pool key -> profile number -> its group's position
        self._devices: dict[str, tuple[Device | Mapping[str, object], ...]] = {}
        self._by_region: dict[str, list[PoolView]] = {}
        self._pools_of: dict[str, list[PoolView]] = {}
        self._memo: dict[tuple[object, ...], object] = {}
        self._profile_memo: dict[tuple[int, object], object] = {}
        self._trees: dict[str, object] = {}  # root cohort -> what `per_tree` keeps for it, as tenants are
        for pool in self.pools:
            missing = [name for name in pool.nodes if name not in self.nodes]
            if missing:
                raise ValueError(f"pool {pool.key} names nodes that are not in the snapshot: {', '.join(missing)}")
            self._set_groups(pool)
            self._devices[pool.key] = tuple(_prepared(device) for device in pool.devices)
            self._by_region.setdefault(pool.region, []).append(pool)
            for name in pool.nodes:
                self._pools_of.setdefault(name, []).append(pool)
        self._classes, self._class_of = _pool_classes(self._by_region, self._devices)
        self._position = {pool.key: at for pools in self._by_region.values() for at, pool in enumerate(pools)}
        self._counts: dict[int, dict[int, int]] = {}  # class id -> profile number -> nodes of its pools
        self._postings: dict[int, dict[int, Postings]] = {}  # class id -> profile number -> where its nodes are
        for pool_class in (c for classes in self._classes.values() for c in classes):
            self._count_class(pool_class)

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
        new.regions, new.tenants, new.cohorts, new.pools = self.regions, self.tenants, self.cohorts, self.pools
        new._trees = self._trees  # the same tenants: the same trees
        new._devices, new._by_region, new._pools_of = self._devices, self._by_region, self._pools_of
        new._classes, new._class_of, new._position = self._classes, self._class_of, self._position
        new.nodes = {**self.nodes, **changed}
        new._keys = dict(self._keys)
        new._profiles = list(self._profiles)
        new._node_keys = {**self._node_keys, **{name: new._key(profile_of(node)) for name, node in changed.items()}}
        new._groups = dict(self._groups)
        new._group_at = dict(self._group_at)
        for pool in {pool.key: pool for name in changed for pool in self.pools_of(name)}.values():
            new._set_groups(pool)
        # Each changed node moves from its old profile's count to its new one's, in the class of each of its pools;
        # the postings of those two profiles in that class are laid out again (over the class's pools).
        new._counts, new._postings = dict(self._counts), dict(self._postings)
        touched: dict[int, tuple[PoolClass, set[int]]] = {}  # class id -> the class, profiles whose postings changed
        for name in changed:
            old, now = self._node_keys[name], new._node_keys[name]
            if old == now:
                continue
            for pool in self.pools_of(name):
                pool_class = self._class_of[pool.key]
                class_id = pool_class.id
                if class_id not in touched:
                    touched[class_id] = (pool_class, set())
                    new._counts[class_id] = dict(new._counts[class_id])
                touched[class_id][1].update((old, now))
                counts = new._counts[class_id]
                counts[now] = counts.get(now, 0) + 1
                counts[old] -= 1
                if not counts[old]:
                    del counts[old]
        for class_id, (pool_class, keys) in touched.items():
            if len(keys) > _REPOST_LIMIT:
                new._count_class(pool_class, counts=False)
                continue
            postings = new._postings[class_id] = dict(new._postings[class_id])
            for key in keys:
                laid_out = new._post(pool_class, key)
                if laid_out is None:
                    postings.pop(key, None)
                else:
                    postings[key] = laid_out
        # Ranking threads may add to this snapshot's memo meanwhile: copy it in one step (atomic), then filter.
        new._memo = {key: value for key, value in self._memo.copy().items() if key[0] not in touched}
        new._profile_memo = dict(self._profile_memo)  # its numbers name the same profiles here; new ones follow
        return new

    def with_tenants(self, tenants: Iterable[TenantView]) -> Snapshot:
        """A snapshot with these tenants (policy and current usage), sharing everything else with this one."""
        new = object.__new__(Snapshot)
        for name in Snapshot.__slots__:
            setattr(new, name, getattr(self, name))
        new.tenants = {t.name: t for t in tenants}
        new._trees = {}
        return new

    def per_tree(self, root: str, compute: Callable[[], T]) -> T:
        """`compute()`, kept for this snapshot's tenants under a cohort tree's root: what depends on the tree's
        tenants and their usage (`scheduler.quota.accounts.snapshot_tree`), which `with_tenants` forgets."""
        try:
            return self._trees[root]  # type: ignore[return-value]
        except KeyError:
            value = self._trees[root] = compute()
            return value

    def within(self, regions: Iterable[str]) -> Snapshot:
        """This snapshot cut down to `regions`, their pools and those pools' nodes, sharing profiles and groups with
        this one: the fleet as a tenant may use it (`scheduler.placement.tenant_scope`), so nothing it is shown names or counts
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
        new._classes = {name: classes for name, classes in self._classes.items() if name in new.regions}
        return new

    def _count_class(self, pool_class: PoolClass, *, counts: bool = True) -> None:
        """The class's profile counts and postings, from its pools' groups."""
        found: dict[int, int] = {}
        where: dict[int, tuple[list[int], list[int]]] = {}
        for pool in pool_class.pools:
            at = self._position[pool.key]
            for group in self._groups[pool.key]:
                found[group.key] = found.get(group.key, 0) + len(group.nodes)
                positions, ends = where.setdefault(group.key, ([], [0]))
                positions.append(at)
                ends.append(ends[-1] + len(group.nodes))
        if counts:
            self._counts[pool_class.id] = found
        self._postings[pool_class.id] = {key: Postings(tuple(p), tuple(e)) for key, (p, e) in where.items()}

    def _post(self, pool_class: PoolClass, key: int) -> Postings | None:
        positions: list[int] = []
        ends = [0]
        for pool in pool_class.pools:
            at = self._group_at[pool.key].get(key)
            if at is not None:
                positions.append(self._position[pool.key])
                ends.append(ends[-1] + len(self._groups[pool.key][at].nodes))
        return Postings(tuple(positions), tuple(ends)) if positions else None

    def _key(self, profile: NodeProfile) -> int:
        key = self._keys.setdefault(profile, len(self._keys))
        if key == len(self._profiles):
            self._profiles.append(profile)
        return key

    def _set_groups(self, pool: PoolView) -> None:
        profiles = self._profiles
        by_key: dict[int, list[str]] = {}
        for name in sorted(pool.nodes):
            by_key.setdefault(self._node_keys[name], []).append(name)
        self._groups[pool.key] = tuple(NodeGroup(profiles[key], key, tuple(members)) for key, members in by_key.items())
        self._group_at[pool.key] = {key: position for position, key in enumerate(by_key)}

    def pools_in(self, region: str) -> list[PoolView]:
        return self._by_region.get(region, [])

    def pools_of(self, node: str) -> list[PoolView]:
        return self._pools_of.get(node, [])

    def groups(self, pool: PoolView) -> tuple[NodeGroup, ...]:
        return self._groups[pool.key]

    def group_positions(self, pool: PoolView) -> Mapping[int, int]:
        """Profile number -> the position of the pool's group of that profile in `groups(pool)`."""
        return self._group_at[pool.key]

    def profile(self, key: int) -> NodeProfile:
        return self._profiles[key]

    def pool_classes(self, region: str) -> tuple[PoolClass, ...]:
        """The region's pools by class, the classes in the order of their first pool."""
        return self._classes.get(region, ())

    def pool_class(self, pool_key: str) -> PoolClass:
        """The class of the pool `pool_key` names."""
        return self._class_of[pool_key]

    def profile_counts(self, pool_class: PoolClass) -> Mapping[int, int]:
        """Profile number -> how many nodes of the class's pools have it (a node in two of them counts twice, as
        it does in their groups). Profiles none of them has are absent."""
        return self._counts[pool_class.id]

    def postings(self, pool_class: PoolClass, key: int) -> Postings | None:
        """Where the class's nodes of profile `key` are, pool by pool (None: none has it)."""
        return self._postings[pool_class.id].get(key)

    def position(self, pool: PoolView) -> int:
        """The pool's position in `pools_in(pool.region)`."""
        return self._position[pool.key]

    def profile_memo(self, key: int, kind: object, compute: Callable[[NodeProfile], T]) -> T:
        """`compute(profile(key))`, kept for this snapshot and those `with_nodes` derives from it, by profile number
        and `kind` (what the value depends on besides the profile: a request's shape, size and NUMA policy)."""
        try:
            return self._profile_memo[(key, kind)]  # type: ignore[return-value]
        except KeyError:
            value = self._profile_memo[(key, kind)] = compute(self._profiles[key])
            return value

    def memo(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """`compute()`, kept for this snapshot under `key`. `key[0]` must be the id of the pool class whose
        `profile_counts` the value derives from (with the profiles themselves, which never change): `with_nodes`
        keeps the values of the classes it leaves alone. The value must not depend on the request's anything but
        what `key` holds. Safe across threads: at worst two compute the same value (and `with_nodes` copies the memo
        in one step before it reads it)."""
        try:
            return self._memo[key]  # type: ignore[return-value]
        except KeyError:
            value = self._memo[key] = compute()
            return value

    def profile_key(self, node: str) -> int:
        return self._node_keys[node]

    def devices(self, pool: PoolView) -> tuple[Device | Mapping[str, object], ...]:
        """The pool's GPU devices, converted for CEL once per snapshot rather than once per request."""
        return self._devices[pool.key]


def _pool_classes(
    by_region: Mapping[str, list[PoolView]], devices: Mapping[str, tuple[Device | Mapping[str, object], ...]]
) -> tuple[dict[str, tuple[PoolClass, ...]], dict[str, PoolClass]]:
    """Each region's pools by what the pool filters look at (keep in step with `scheduler.placement.pools.filter_pools`)."""
    classes: dict[str, tuple[PoolClass, ...]] = {}
    class_of: dict[str, PoolClass] = {}
    number = 0
    for region, pools in by_region.items():
        members: dict[object, list[PoolView]] = {}
        for pool in pools:
            members.setdefault(_class_key(pool, devices[pool.key]), []).append(pool)
        found = []
        for same in members.values():
            pool_class = PoolClass(number, same[0], tuple(same))
            number += 1
            found.append(pool_class)
            for pool in same:
                class_of[pool.key] = pool_class
        classes[region] = tuple(found)
    return classes, class_of


def _class_key(pool: PoolView, devices: tuple[Device | Mapping[str, object], ...]) -> object:
    """What every pool filter's verdict (and message) depends on. A device that did not convert for CEL, or labels
    that do not hash, make a class of the pool alone."""
    if devices:
        from scheduler.cel import Device

        if not all(isinstance(device, Device) for device in devices):
            return ("pool", pool.key)
    key = (
        pool.region,
        pool.shape,
        pool.gpu_product,
        pool.cluster_ready,
        pool.max_lease_seconds,
        tuple(sorted(pool.cluster_labels.items())),
        tuple(device.key for device in devices),  # type: ignore[union-attr]
    )
    try:
        hash(key)
    except TypeError:
        return ("pool", pool.key)
    return key


def _prepared(device: Mapping[str, object]) -> Device | Mapping[str, object]:
    """A malformed device stays as published: selectors then fail on it, per pool, with the device's fault."""
    from scheduler.cel import DeviceError, prepare_device

    try:
        return prepare_device(device)
    except DeviceError:
        return device
