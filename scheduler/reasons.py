"""The readable clause each reason code (`contracts/reasons.py`) turns a count into: "10 are not READY", "1 lacks
per-slot fabric VFs", in singular and plural. `{g}` stands for the number of GPUs requested.
"""

from __future__ import annotations

from contracts.reasons import Reason

# (singular, plural) clause for a count of dropped candidates. Refusal-only codes (no_region, no_matching_pool,
# insufficient_capacity, no_compatible_bundles) summarise a whole level and need no clause.
_PHRASES: dict[Reason, tuple[str, str]] = {
    Reason.UNKNOWN_TENANT: ("is not a known tenant", "are not known tenants"),
    Reason.QUOTA_EXCEEDED: ("would exceed the tenant's quota", "would exceed the tenant's quota"),
    Reason.UNKNOWN_REGION: ("is not a known region", "are not known regions"),
    Reason.REGION_NOT_ALLOWED: ("is not allowed for the tenant", "are not allowed for the tenant"),
    Reason.JURISDICTION_MISMATCH: ("is outside the required jurisdiction", "are outside the required jurisdiction"),
    Reason.REGION_UNAVAILABLE: ("is unavailable", "are unavailable"),
    Reason.PRODUCT_NOT_OFFERED: ("does not offer the product and shape", "do not offer the product and shape"),
    Reason.NO_POOL_MATCHES: (
        "has no pool matching the cluster selector, readiness and device selectors",
        "have no pool matching the cluster selector, readiness and device selectors",
    ),
    Reason.SHAPE_MISMATCH: ("has another capacity shape", "have another capacity shape"),
    Reason.PRODUCT_MISMATCH: ("has another GPU product", "have another GPU product"),
    Reason.CLUSTER_LABELS_MISMATCH: (
        "is in a cluster that does not match the cluster selector",
        "are in clusters that do not match the cluster selector",
    ),
    Reason.CLUSTER_NOT_READY: ("is in a cluster that is not Ready", "are in clusters that are not Ready"),
    Reason.SELECTOR_MISMATCH: ("has no GPU device matching the selectors", "have no GPU device matching the selectors"),
    Reason.SELECTOR_ERROR: ("failed to evaluate the selectors", "failed to evaluate the selectors"),
    Reason.LEASE_TOO_LONG: ("grants shorter leases than asked", "grant shorter leases than asked"),
    Reason.NODE_NOT_READY: ("is not READY", "are not READY"),
    Reason.AGENT_DOWN: ("has no live node agent", "have no live node agent"),
    Reason.NODE_COOLING_OFF: (
        "is cooling off after repeated failed attempts",
        "are cooling off after repeated failed attempts",
    ),
    Reason.NODE_EXCLUDED: ("was excluded by the request", "were excluded by the request"),
    Reason.NODE_RESERVED: (
        "is reserved for the request at the head of its queue",
        "are reserved for the request at the head of its queue",
    ),
    Reason.NODE_NOT_PINNED: ("is not one of the pinned nodes", "are not among the pinned nodes"),
    Reason.NO_PINNED_NODE: ("holds none of the pinned nodes", "hold none of the pinned nodes"),
    Reason.NODE_TOO_SMALL: ("has fewer than {g} GPUs", "have fewer than {g} GPUs"),
    Reason.NODE_SIZE_MISMATCH: ("does not have exactly {g} GPUs", "do not have exactly {g} GPUs"),
    Reason.SLOTS_UNAPPROVED: ("has fewer than {g} approved slots", "have fewer than {g} approved slots"),
    Reason.MISSING_PER_SLOT_VF: ("lacks per-slot fabric VFs", "lack per-slot fabric VFs"),
    Reason.SLOTS_INVALID: (
        "has fewer than {g} slots that validate against the host",
        "have fewer than {g} slots that validate against the host",
    ),
    Reason.NUMA_UNSATISFIABLE: (
        "cannot fit {g} bundles on one NUMA node",
        "cannot fit {g} bundles on one NUMA node",
    ),
    Reason.INSUFFICIENT_BUNDLES: (
        "has fewer than {g} compatible free bundles",
        "have fewer than {g} compatible free bundles",
    ),
    Reason.SLOTS_QUARANTINED: ("would fit but for quarantined slots", "would fit but for quarantined slots"),
    Reason.GPU_UNHEALTHY: ("would fit but for unhealthy GPUs", "would fit but for unhealthy GPUs"),
    Reason.SLOTS_LEASED: (
        "would fit but for slots leased to in-flight allocations",
        "would fit but for slots leased to in-flight allocations",
    ),
    Reason.NODE_IN_USE: ("is not wholly free", "are not wholly free"),
    Reason.SLOT_UNAPPROVED: ("is not approved for slices", "are not approved for slices"),
    Reason.SLOT_MISSING_VF: ("has no per-slot fabric VF", "have no per-slot fabric VF"),
    Reason.SLOT_SHARED_VF: ("shares its fabric VF with another slot", "share their fabric VF with another slot"),
    Reason.SLOT_INVALID: ("failed validation against the host", "failed validation against the host"),
    Reason.SLOT_UNVALIDATED: ("has not been validated by its agent", "have not been validated by their agent"),
    Reason.SLOT_FABRIC_INVALID: (
        "has a fabric VF that failed validation on the host",
        "have fabric VFs that failed validation on the host",
    ),
    Reason.SLOT_CLAIMED: ("is claimed by another allocation", "are claimed by other allocations"),
    Reason.SLOT_LEASED: ("is leased to another allocation", "are leased to other allocations"),
    Reason.SLOT_QUARANTINED: ("is quarantined", "are quarantined"),
    Reason.SLOT_UNHEALTHY: ("has an unhealthy GPU", "have unhealthy GPUs"),
    Reason.SLOT_NOT_CHOSEN: ("is usable but was not chosen", "are usable but were not chosen"),
}


def clause(reason: Reason, gpu_count: int, plural: bool = False) -> str:
    """`INSUFFICIENT_BUNDLES, 2` -> "has fewer than 2 compatible free bundles"."""
    singular, many = _PHRASES.get(reason, (f"was dropped ({reason})", f"were dropped ({reason})"))
    return (many if plural else singular).format(g=gpu_count)


def phrase(reason: Reason, count: int, gpu_count: int) -> str:
    """`3, INSUFFICIENT_BUNDLES, 2` -> "3 have fewer than 2 compatible free bundles"."""
    return f"{count} {clause(reason, gpu_count, plural=count != 1)}"
