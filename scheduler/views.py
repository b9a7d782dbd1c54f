"""The data a snapshot is made of: regions, pools, nodes with their slots, tenants with their usage.

Slotted frozen dataclasses rather than pydantic models: a snapshot may hold 10,000 nodes and 80,000 slots and is
built on every scheduling pass, and validation belongs where data enters Berth (the fleet loader, the node agent's
discovery, the database), not here. The same `NodeView` is the node agent's view of its own host when it plans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contracts.placement import SlotId
from contracts.vocabulary import (
    DEFAULT_FAIR_SHARING_STRATEGIES,
    BorrowWithinCohort,
    CohortQuotaMode,
    FabricClaimMode,
    FairSharingStrategy,
    NodeStatus,
    PoolShape,
    QueueingStrategy,
    ReclaimWithinCohort,
    RegionStatus,
    SlotState,
    WithinTenant,
)
from scheduler.breaker import Cooling
from scheduler.host.checks import ValidationState
from scheduler.host.health import HealthState

if TYPE_CHECKING:
    from fleet.node import Slot


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot (docs/seeds.md, "The GPU slice bundle") and its state. The device identities feed the node
    scheduler's plan."""

    id: SlotId  # stable, given by the caller (fleet-built snapshots use "<node>/<index>")
    index: int
    approved: bool
    fabric_claim_mode: FabricClaimMode
    fabric_vf_pci: str | None
    numa_node: int
    state: SlotState = SlotState.FREE
    holder: str | None = None  # the allocation that claims or leases it
    gpu_pci: str = ""
    fabric_parent_pci: str | None = None
    nvme_device: str | None = None
    vcpus: int = 0
    memory_mib: int = 0
    mac: str | None = None
    private_ip: str | None = None
    # The node agent's check of the slot against its host. Offline (a fleet file alone) every slot counts as valid:
    # there is no agent to ask, and the operator's approval is all there is.
    validation: ValidationState = ValidationState.VALID
    validation_reason: str | None = None  # the first failed check (`scheduler.host.checks.SlotCheck`)
    # Its agent's health verdict: only a healthy slot takes new work; what holds it keeps it.
    health: HealthState = HealthState.HEALTHY
    health_reason: str | None = None


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    status: NodeStatus
    slots: tuple[SlotView, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    numa_nodes: int = 1
    agent_live: bool = True  # a node agent has reported recently and has not missed a task since
    cooling_off: Cooling | None = None  # the node breaker tripped: not ranked until then (`scheduler.breaker`)


@dataclass(frozen=True, slots=True)
class RegionView:
    name: str
    status: RegionStatus
    jurisdiction: str | None = None
    prices: Mapping[str, float] = field(default_factory=dict)  # per GPU-hour, by product
    queueing_strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO  # how its queue is walked

    def price(self, product: str) -> float | None:
        wanted = product.casefold()
        return next((price for name, price in self.prices.items() if name.casefold() == wanted), None)


@dataclass(frozen=True, slots=True)
class PoolView:
    cluster: str
    name: str
    region: str
    shape: PoolShape
    gpu_product: str | None
    nodes: tuple[str, ...]
    devices: tuple[Mapping[str, object], ...] = ()  # the InferenceClass's claimable GPU devices, as CEL sees them
    cluster_labels: Mapping[str, str] = field(default_factory=dict)
    cluster_ready: bool = True
    deadlines: Mapping[str, float] = field(default_factory=dict)  # seconds by state the pool sets (fleet/deadlines.py)
    max_lease_seconds: float | None = None  # the longest lease the pool grants (fleet `maxLease`); None: no maximum

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.name}"


@dataclass(frozen=True, slots=True)
class FlavorQuotaView:
    """A tenant's nominal quota of one GPU product, in one region or (region None) in all of them together."""

    product: str
    region: str | None
    nominal: int
    borrowing_limit: int | None = None  # None: unlimited
    lending_limit: int | None = None  # None: all of its unused nominal quota

    def covers(self, product: str, region: str) -> bool:
        return self.product.casefold() == product.casefold() and self.region in (None, region)

    def describe(self) -> str:
        return f"{self.product} in {self.region}" if self.region else self.product


@dataclass(frozen=True, slots=True)
class CohortView:
    """A Cohort object (Kueue's, with `parentName`): a quota of its own that its subtree shares, limits on what it
    borrows from and lends to its parent, and whether fair sharing decides within its tree (set on the root)."""

    name: str
    parent: str | None = None
    gpu_quota: int = 0
    borrowing_limit: int | None = None  # None: unlimited
    lending_limit: int | None = None  # None: all of its subtree's unused quota
    quotas: tuple[FlavorQuotaView, ...] = ()  # its own quota per product (and region)
    fair_sharing: bool = False
    weight: float = 1.0  # its fair-sharing weight among its siblings
    usage_half_life: float | None = (
        None  # seconds; set: its tree orders by decayed usage (scheduler/quota/usage_decay.py)
    )
    # On a fair-sharing root: the strategies its preemptions try, in order (Kueue's `preemptionStrategies`).
    preemption_strategies: tuple[FairSharingStrategy, ...] = DEFAULT_FAIR_SHARING_STRATEGIES
    quota_mode: CohortQuotaMode = CohortQuotaMode.ADDITIVE  # Department: its quota caps its subtree (KAI)


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    """A tenant's `preemption`: Kueue's ClusterQueue preemption, per tenant. Nothing by default."""

    within_tenant: WithinTenant = WithinTenant.NEVER
    reclaim_within_cohort: ReclaimWithinCohort = ReclaimWithinCohort.NEVER
    borrow_within_cohort: BorrowWithinCohort = BorrowWithinCohort.NEVER
    max_priority_threshold: int | None = None  # borrowWithinCohort: only victims of at most this priority


@dataclass(frozen=True, slots=True)
class TenantView:
    name: str
    gpu_quota: int
    allowed_regions: frozenset[str] | None = None  # None: every region
    required_jurisdiction: str | None = None
    active_gpus: int = 0
    in_flight_gpus: int = 0
    weight: float = 1.0  # fair-sharing weight (0: always last), when its cohort tree shares fairly
    cohort: str | None = None  # tenants of one cohort lend each other unused quota (scheduler/quota/accounts.py)
    borrowing_limit: int | None = None  # None: unlimited
    lending_limit: int | None = None  # None: all of its unused quota
    quotas: tuple[FlavorQuotaView, ...] | None = None  # per product (and region); None: gpu_quota alone
    held: tuple[tuple[str, str, int], ...] = ()  # (product, region, GPUs) of its placed GPUs, for `quotas`
    preemption: PreemptionPolicy = PreemptionPolicy()  # what its queued requests may displace
    # GPU-seconds decayed to the pass's instant, where its tree orders by them (`fairSharing.usageHalfLife`,
    # scheduler/quota/usage_decay.py); None: its tree, if it shares fairly, goes by what each holds now.
    decayed_usage: float | None = None


def slot_id(node: str, index: int) -> str:
    return f"{node}/{index}"


def slot_view(node: str, slot: Slot, **overrides: Any) -> SlotView:
    """An approved fleet slot as the scheduler sees it (free and valid unless `overrides` say otherwise): what the
    node agent plans on, so it lives here rather than with the fleet-file snapshot (`scheduler.from_fleet`)."""
    return SlotView(
        id=slot_id(node, slot.index),
        index=slot.index,
        approved=slot.approved,
        fabric_claim_mode=slot.fabric_claim_mode,
        fabric_vf_pci=slot.fabric_vf_pci,
        numa_node=slot.numa_node,
        gpu_pci=slot.gpu_pci,
        fabric_parent_pci=slot.fabric_parent_pci,
        nvme_device=slot.nvme_device,
        vcpus=slot.vcpus,
        memory_mib=slot.memory_mib,
        mac=slot.mac,
        private_ip=str(slot.private_ip) if slot.private_ip is not None else None,
        **overrides,
    )
