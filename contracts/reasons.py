"""Reason codes: why a candidate was dropped at some level, or why a whole request was refused.

Codes are stable strings (they appear in API responses, allocation failure reasons and Temporal search details), so
a client can branch on them. The readable clause each code turns a count into ("10 are not READY") is the
scheduler's (`scheduler/reasons.py`).
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # tenant
    UNKNOWN_TENANT = "unknown_tenant"
    QUOTA_EXCEEDED = "quota_exceeded"
    # region
    UNKNOWN_REGION = "unknown_region"
    REGION_NOT_ALLOWED = "region_not_allowed"
    JURISDICTION_MISMATCH = "jurisdiction_mismatch"
    REGION_UNAVAILABLE = "region_unavailable"
    PRODUCT_NOT_OFFERED = "product_not_offered"
    NO_POOL_MATCHES = "no_pool_matches"
    NO_REGION = "no_region"
    NO_PINNED_NODE = "no_pinned_node"
    # pool
    SHAPE_MISMATCH = "shape_mismatch"
    PRODUCT_MISMATCH = "product_mismatch"
    CLUSTER_LABELS_MISMATCH = "cluster_labels_mismatch"
    CLUSTER_NOT_READY = "cluster_not_ready"
    SELECTOR_MISMATCH = "selector_mismatch"
    SELECTOR_ERROR = "selector_error"
    LEASE_TOO_LONG = "lease_too_long"  # the request's lease is longer than the pool grants (fleet `maxLease`)
    NO_MATCHING_POOL = "no_matching_pool"
    # node
    NODE_NOT_READY = "node_not_ready"
    AGENT_DOWN = "agent_down"
    NODE_COOLING_OFF = "node_cooling_off"
    NODE_EXCLUDED = "node_excluded"
    NODE_RESERVED = "node_reserved"
    NODE_NOT_PINNED = "node_not_pinned"
    NODE_TOO_SMALL = "node_too_small"
    NODE_SIZE_MISMATCH = "node_size_mismatch"
    SLOTS_UNAPPROVED = "slots_unapproved"
    MISSING_PER_SLOT_VF = "missing_per_slot_vf"
    SLOTS_INVALID = "slots_invalid"
    NUMA_UNSATISFIABLE = "numa_unsatisfiable"
    INSUFFICIENT_BUNDLES = "insufficient_bundles"
    SLOTS_QUARANTINED = "slots_quarantined"
    GPU_UNHEALTHY = "gpu_unhealthy"  # would fit but for slots whose GPU health is not `healthy`
    SLOTS_LEASED = "slots_leased"
    NODE_IN_USE = "node_in_use"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    NO_COMPATIBLE_BUNDLES = "no_compatible_bundles"
    PINNED_NODES_UNAVAILABLE = "pinned_nodes_unavailable"
    PREEMPTING = "preempting"  # running allocations were told to leave for it (scheduler/admission/preemption.py)
    QUEUED_BEHIND = "queued_behind"  # a StrictFIFO queue has requests to place first (scheduler/admission/admit.py)
    # slot (bundle level, inside the node scheduler)
    SLOT_UNAPPROVED = "slot_unapproved"
    SLOT_MISSING_VF = "slot_missing_vf"
    SLOT_SHARED_VF = "slot_shared_vf"
    SLOT_INVALID = "slot_invalid"
    SLOT_UNVALIDATED = "slot_unvalidated"
    SLOT_FABRIC_INVALID = "slot_fabric_invalid"
    SLOT_CLAIMED = "slot_claimed"
    SLOT_LEASED = "slot_leased"
    SLOT_QUARANTINED = "slot_quarantined"
    SLOT_UNHEALTHY = "slot_unhealthy"  # its GPU's health is degraded, failed or unknown
    SLOT_NOT_CHOSEN = "slot_not_chosen"
