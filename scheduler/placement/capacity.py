"""Capacity surfaces: per pool, raw free GPUs next to what the node scheduler would actually accept.

Capacity surfaces tell raw free slots from what the node scheduler would accept (docs/seeds.md, "Raw free GPUs
versus placeable slices"): a host whose slots share a parent fabric device shows 8 raw free GPUs and room for 0
slices. Each slice count answers "how many allocations of this size alone would fit right now", computed
independently per size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from contracts.placement import GPU_STATES, CapacityShape, GpuState, NumaPolicy, PoolCapacity, same_product
from contracts.vocabulary import NodeStatus, SlotState
from scheduler.compatibility import NodeProfile
from scheduler.host.health import HealthState
from scheduler.placement.node_filters import node_filters, verdict
from scheduler.snapshot import NodeGroup, PoolClass, Snapshot
from scheduler.views import NodeView, PoolView

SLICE_SIZES: tuple[int, ...] = (1, 2, 4, 8)


def allocations_on(node: NodeProfile, shape: CapacityShape, gpus: int, numa_policy: NumaPolicy) -> int:
    """How many allocations of `gpus` GPUs the node could take one after another, as the node scheduler plans."""
    if verdict(node, node_filters(shape, gpus, numa_policy)) is not None:
        return 0
    if shape is CapacityShape.BAREMETAL:
        return 1
    if numa_policy is NumaPolicy.REQUIRED:
        return sum(free // gpus for free in node.numa_free)
    return node.compatible_free // gpus


class AllocationCount:
    """Allocations of one size that pools could take now, computed once per distinct node profile."""

    def __init__(self, shape: CapacityShape, gpus: int, numa_policy: NumaPolicy) -> None:
        self.shape = shape
        self.gpus = gpus
        self.numa_policy = numa_policy
        self._per_node: dict[int, int] = {}

    def of_group(self, group: NodeGroup) -> int:
        if group.key not in self._per_node:
            self._per_node[group.key] = allocations_on(group.profile, self.shape, self.gpus, self.numa_policy)
        return self._per_node[group.key] * len(group.nodes)

    def of_pool(self, snapshot: Snapshot, pool: PoolView) -> int:
        """Zero when the pool's cluster is not Ready or its shape differs."""
        if not pool.cluster_ready or pool.shape != self.shape:
            return 0
        return sum(self.of_group(group) for group in snapshot.groups(pool))

    def of_class(self, snapshot: Snapshot, pool_class: PoolClass) -> int:
        """`of_pool` summed over the class's pools, from the class's profile counts: computed once per snapshot and
        kind of request, not once per decision over every node group."""
        pool = pool_class.pool
        if not pool.cluster_ready or pool.shape != self.shape:
            return 0
        key = (pool_class.id, "allocations", self.shape, self.gpus, self.numa_policy)
        return snapshot.memo(key, lambda: self._of_counts(snapshot, snapshot.profile_counts(pool_class)))

    def _of_counts(self, snapshot: Snapshot, counts: Mapping[int, int]) -> int:
        kind = ("allocations", self.shape, self.gpus, self.numa_policy)
        total = 0
        for key, nodes in counts.items():
            total += snapshot.profile_memo(key, kind, self._allocations_on) * nodes
        return total

    def _allocations_on(self, profile: NodeProfile) -> int:
        return allocations_on(profile, self.shape, self.gpus, self.numa_policy)


def gpu_states(node: NodeView, reserved: int = 0) -> list[tuple[int, GpuState]]:
    """Each slot's state as a person reads the fleet, by slot index: one state per GPU, the first that applies of
    failed, quarantined, degraded (or of unknown health), held (an active claim), leased (being placed), off (free,
    but its node takes no new work: cordoned, draining, down or without a live agent; or its GPU did not validate),
    reserved (free, but promised to a reservation whose window is open: `reserved` of them, lowest index first) and
    free."""
    takes_work = node.status is NodeStatus.READY and node.agent_live
    states: list[tuple[int, GpuState]] = []
    for slot in sorted(node.slots, key=lambda s: s.index):
        state: GpuState
        if slot.health is HealthState.FAILED:
            state = "failed"
        elif slot.state is SlotState.QUARANTINED:
            state = "quarantined"
        elif slot.health is not HealthState.HEALTHY:
            state = "degraded"
        elif slot.state is SlotState.CLAIMED:
            state = "held"
        elif slot.state is SlotState.LEASED:
            state = "leased"
        elif not takes_work or not slot.validation.counts_raw:
            state = "off"
        elif reserved > 0:
            state, reserved = "reserved", reserved - 1
        else:
            state = "free"
        states.append((slot.index, state))
    return states


def gpu_state_counts(snapshot: Snapshot, pool: PoolView, reserved: Mapping[str, int]) -> dict[GpuState, int]:
    """The pool's GPUs counted by `gpu_states`: one pass over its slots (80,000 at 10,000 nodes of 8 take about
    as long as one placement decision), no query."""
    counted: Counter[GpuState] = Counter()
    for name in pool.nodes:
        counted.update(state for _, state in gpu_states(snapshot.nodes[name], reserved.get(name, 0)))
    return {state: counted[state] for state in GPU_STATES}


def capacity(
    snapshot: Snapshot,
    *,
    region: str | None = None,
    gpu_product: str | None = None,
    numa_policy: NumaPolicy = NumaPolicy.PREFERRED,
    reserved: Mapping[str, int] | None = None,
) -> list[PoolCapacity]:
    """Per pool, what it could take now; `reserved`: GPUs per node promised to reservations whose window is open
    and not yet held by their allocation (each pool's `states` counts them as reserved)."""
    counts = {size: AllocationCount(CapacityShape.GPU_SLICE, size, numa_policy) for size in SLICE_SIZES}
    result: list[PoolCapacity] = []
    for pool in snapshot.pools:
        if region is not None and pool.region != region:
            continue
        if gpu_product is not None and not same_product(pool.gpu_product, gpu_product):
            continue
        groups = snapshot.groups(pool)
        ready = [group for group in groups if group.profile.status is NodeStatus.READY and group.profile.agent_live]
        baremetal = 0
        if pool.cluster_ready and pool.shape == CapacityShape.BAREMETAL:
            baremetal = sum(
                allocations_on(group.profile, CapacityShape.BAREMETAL, group.profile.gpus, numa_policy)
                * len(group.nodes)
                for group in groups
            )
        result.append(
            PoolCapacity(
                pool=pool.key,
                cluster=pool.cluster,
                region=pool.region,
                shape=pool.shape,
                gpu_product=pool.gpu_product,
                nodes=sum(len(group.nodes) for group in groups),
                ready_nodes=sum(len(group.nodes) for group in ready),
                agents_down=sum(len(group.nodes) for group in groups if not group.profile.agent_live),
                cooling_off=sum(len(group.nodes) for group in ready if group.profile.cooling_off is not None),
                gpus=sum(group.profile.gpus * len(group.nodes) for group in groups),
                validated_gpus=sum(group.profile.raw_usable * len(group.nodes) for group in groups),
                compatible_gpus=sum(group.profile.compatible * len(group.nodes) for group in groups),
                raw_free_gpus=sum(group.profile.raw_free * len(group.nodes) for group in ready),
                degraded_gpus=sum(group.profile.degraded * len(group.nodes) for group in groups),
                failed_gpus=sum(group.profile.failed * len(group.nodes) for group in groups),
                slices={size: counts[size].of_pool(snapshot, pool) for size in SLICE_SIZES},
                baremetal_nodes=baremetal,
                states=gpu_state_counts(snapshot, pool, reserved or {}),
            )
        )
    return result
