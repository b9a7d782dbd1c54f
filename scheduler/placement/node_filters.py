"""Node feasibility plugins: each checks one thing about a node's profile and names the reason when the node cannot
take the request.

The first failure is the node's reason, so a node that is DOWN is reported as not READY even if its slots are
also leased. A plugin is *static*
when it depends only on hardware and approval, never on slot state or node status; a node failing a static plugin
can never take this request, which is what separates `no_compatible_bundles` from `insufficient_capacity`.

The same plugin chain serves the cluster scheduler, the node scheduler and the capacity surfaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Protocol

from contracts.placement import CapacityShape, NumaPolicy
from contracts.reasons import Reason
from contracts.vocabulary import NodeStatus
from scheduler.compatibility import NodeProfile
from scheduler.placement.plugins import Filter, first_failure
from scheduler.snapshot import NodeGroup


class NodeFilter(Filter[NodeProfile], Protocol):
    static: bool


@dataclass(frozen=True)
class NodeReady:
    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.status is NodeStatus.READY else Reason.NODE_NOT_READY


@dataclass(frozen=True)
class AgentLive:
    """A node whose agent is not live cannot plan: ranking it first would only cost the pickup timeout."""

    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.agent_live else Reason.AGENT_DOWN


@dataclass(frozen=True)
class NotCoolingOff:
    """A node whose recent attempts kept failing sits out its cool-off (`scheduler.breaker`): ranking it first would
    cost the next allocation the same failure. Not static: the node takes requests again once the cool-off ends."""

    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.cooling_off is None else Reason.NODE_COOLING_OFF


@dataclass(frozen=True)
class NodeSize:
    """Slices need at least g GPUs on the node; bare metal takes the whole host, so its size must be exactly g (the
    plan, the claims and the quota charge are then all g GPUs)."""

    gpus: int
    exact: bool
    static = True

    def check(self, node: NodeProfile) -> Reason | None:
        if self.exact:
            return None if node.gpus == self.gpus else Reason.NODE_SIZE_MISMATCH
        return None if node.gpus >= self.gpus else Reason.NODE_TOO_SMALL


@dataclass(frozen=True)
class SlotApproval:
    gpus: int
    static = True

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.approved >= self.gpus else Reason.SLOTS_UNAPPROVED


@dataclass(frozen=True)
class PerSlotFabric:
    """Only approved slots with their own fabric VF are bundles (docs/seeds.md, "A slice needs its own fabric VF")."""

    gpus: int
    static = True

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.declared >= self.gpus else Reason.MISSING_PER_SLOT_VF


@dataclass(frozen=True)
class SlotsValidated:
    """Declared bundles count only once the node agent has validated them against the host."""

    gpus: int
    static = True

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.compatible >= self.gpus else Reason.SLOTS_INVALID


@dataclass(frozen=True)
class HostValidated:
    """Bare metal hands over the whole host: every GPU must have validated (fabric aside, which it does not slice)."""

    static = True

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.raw_usable == node.gpus else Reason.SLOTS_INVALID


@dataclass(frozen=True)
class NumaTopology:
    """With NUMA required, some NUMA node must hold g compatible bundles at all."""

    gpus: int
    static = True

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.numa_compatible >= self.gpus else Reason.NUMA_UNSATISFIABLE


@dataclass(frozen=True)
class FreeBundles:
    """Bundles held by active allocations: the node is simply busy."""

    gpus: int
    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        unclaimed = (
            node.compatible_free + node.compatible_leased + node.compatible_quarantined + node.compatible_unhealthy
        )
        return None if unclaimed >= self.gpus else Reason.INSUFFICIENT_BUNDLES


@dataclass(frozen=True)
class Healthy:
    """Bundles free but for their GPU's health: degraded, failed or unknown slots take no new work."""

    gpus: int
    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        usable = node.compatible_free + node.compatible_leased + node.compatible_quarantined
        return None if usable >= self.gpus else Reason.GPU_UNHEALTHY


@dataclass(frozen=True)
class NoQuarantine:
    gpus: int
    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.compatible_free + node.compatible_leased >= self.gpus else Reason.SLOTS_QUARANTINED


@dataclass(frozen=True)
class NoLeases:
    gpus: int
    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.compatible_free >= self.gpus else Reason.SLOTS_LEASED


@dataclass(frozen=True)
class NumaFree:
    gpus: int
    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.best_numa_free >= self.gpus else Reason.NUMA_UNSATISFIABLE


@dataclass(frozen=True)
class WhollyFree:
    static = False

    def check(self, node: NodeProfile) -> Reason | None:
        return None if node.wholly_free else Reason.NODE_IN_USE


@cache
def node_filters(shape: CapacityShape, gpus: int, numa_policy: NumaPolicy) -> tuple[NodeFilter, ...]:
    """The plugin chain for one kind of request."""
    if shape is CapacityShape.BAREMETAL:
        return (NodeReady(), AgentLive(), NotCoolingOff(), NodeSize(gpus, exact=True), HostValidated(), WhollyFree())
    chain: list[NodeFilter] = [
        NodeReady(),
        AgentLive(),
        NotCoolingOff(),
        NodeSize(gpus, exact=False),
        SlotApproval(gpus),
        PerSlotFabric(gpus),
        SlotsValidated(gpus),
    ]
    if numa_policy is NumaPolicy.REQUIRED:
        chain.append(NumaTopology(gpus))
    chain += [FreeBundles(gpus), Healthy(gpus), NoQuarantine(gpus), NoLeases(gpus)]
    if numa_policy is NumaPolicy.REQUIRED:
        chain.append(NumaFree(gpus))
    return tuple(chain)


class Judge:
    """One request's verdicts, computed once per distinct node profile of the snapshot rather than once per group
    or node: a busy 10,000-node snapshot has over a thousand groups but about a hundred distinct profiles."""

    def __init__(self, shape: CapacityShape, gpus: int, numa_policy: NumaPolicy) -> None:
        self.filters = node_filters(shape, gpus, numa_policy)
        self._verdicts: dict[int, Reason | None] = {}
        self._possible: dict[int, bool] = {}

    def verdict(self, group: NodeGroup) -> Reason | None:
        if group.key not in self._verdicts:
            self._verdicts[group.key] = verdict(group.profile, self.filters)
        return self._verdicts[group.key]

    def could_ever_fit(self, group: NodeGroup) -> bool:
        if group.key not in self._possible:
            self._possible[group.key] = could_ever_fit(group.profile, self.filters)
        return self._possible[group.key]


def verdict(node: NodeProfile, filters: Sequence[NodeFilter]) -> Reason | None:
    """The first plugin's reason for refusing the node, or None when the node can take the request."""
    return first_failure(node, filters)


def could_ever_fit(node: NodeProfile, filters: Sequence[NodeFilter]) -> bool:
    """Whether the node's hardware could take the request once its slots are free and it is READY again."""
    return all(plugin.check(node) is None for plugin in filters if plugin.static)
