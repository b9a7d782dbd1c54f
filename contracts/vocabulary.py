"""The fleet's enumerations: what a node's status, a slot's fabric claim, a pool's shape, a region's status and
its queueing strategy may be.

Apart from the documents that use them (pydantic models) because the scheduler's views are made of them, and the
node agent plans on those views: an agent that imported them from the documents loaded the whole fleet schema
(every document, the carried-block checks) into the resident memory of every GPU host (docs/benchmarks.md,
"Memory"). The documents' modules re-export them. They are in the wire format because the API's answers (a pool's
capacity, a node's status) carry them to clients that load no fleet schema at all.
"""

from __future__ import annotations

from enum import StrEnum


class NodeStatus(StrEnum):
    READY = "READY"
    CORDONED = "CORDONED"  # an operator took it out of scheduling; existing allocations stay
    DRAINING = "DRAINING"  # being emptied; nothing new lands
    DOWN = "DOWN"


class FabricClaimMode(StrEnum):
    PER_SLOT_VF = "per_slot_vf"  # the slot owns an isolated VF: schedulable for slices
    SHARED_PARENT = "shared_parent"  # slots share the parent device: not a concurrency approval
    NONE = "none"


class PoolShape(StrEnum):
    GPU_SLICE = "gpu_slice"  # VMs cut from per-slot bundles
    BAREMETAL = "baremetal"  # whole hosts
    KUBERNETES = "kubernetes"  # serves ModelDeployments only; counted in nodes, not slots


class RegionStatus(StrEnum):
    AVAILABLE = "available"
    DEGRADED = "degraded"  # still placeable, ranked after available regions
    UNAVAILABLE = "unavailable"  # never chosen; a request naming it is refused with region_unavailable


class QueueingStrategy(StrEnum):
    """Kueue's names for how a queue's head treats those behind it."""

    STRICT_FIFO = "StrictFIFO"  # the head blocks everyone behind it until it is placed
    BEST_EFFORT_FIFO = "BestEffortFIFO"  # a head that does not fit lets those behind it be placed


class WithinTenant(StrEnum):
    """Whether a tenant's queued request may displace the tenant's own running allocations (Kueue's
    withinClusterQueue)."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"


class ClassPreemptionPolicy(StrEnum):
    """Whether a queued request of a PriorityClass may displace others (Kubernetes' PriorityClass
    `preemptionPolicy`): `Never` waits for capacity without displacing anyone."""

    PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
    NEVER = "Never"


class ReclaimWithinCohort(StrEnum):
    """Whether it may take back quota lent to other tenants of its cohort from their borrowing allocations."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class BorrowWithinCohort(StrEnum):
    """Whether a request that would still borrow once admitted may displace others' borrowing allocations."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


class FairSharingStrategy(StrEnum):
    """Kueue's fair-sharing preemption strategies (its `fairSharing.preemptionStrategies`), which a tree's root lists
    in the order they are tried: a victim of another tenant is taken under the first that allows it."""

    # the preemptor's share with its request admitted is at most the victim tenant's share once the victim is gone
    LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
    # the preemptor's share with its request admitted is below the victim tenant's share as it is now
    LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"


# Kueue's default when a configuration names none.
DEFAULT_FAIR_SHARING_STRATEGIES = (
    FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,
    FairSharingStrategy.LESS_THAN_INITIAL_SHARE,
)


class CohortQuotaMode(StrEnum):
    """What a Cohort's own quota means for the tenants under it."""

    # Kueue's Cohort: its quota adds to what its members' quotas give the subtree
    ADDITIVE = "Additive"
    # KAI-Scheduler's department: its quota caps what its members together may use (their quotas lie within it)
    DEPARTMENT = "Department"


class SlotState(StrEnum):
    FREE = "free"
    CLAIMED = "claimed"  # recorded in allocation_resource_claims: an active allocation holds it
    LEASED = "leased"  # a node agent's short host-local lease: an allocation is being placed on it
    QUARANTINED = "quarantined"  # not wiped yet after a failure: never handed out until an agent confirms the wipe
