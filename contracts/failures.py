"""The error types activities fail with and workflows branch on: the one list both sides read.

Temporal carries an activity's failure to its workflow as an `ApplicationError` whose `type` is a string; a typo on
either side would turn a handled failure into an unknown one without a word. So each type is named once, here:
the activities raise with these names, and the allocation workflow compares against them.
"""

from __future__ import annotations

# The claim in PostgreSQL (activities/control/claims.py)
CLAIM_CONFLICT = "ClaimConflict"  # the slots were taken between the plan and the claim: try the next candidate
QUOTA_EXCEEDED = "QuotaExceeded"  # the tenant's quota, re-checked under lock, has no room: the allocation fails

# The node agent (agent/activities.py)
LEASE_LOST = "LeaseLost"  # the host-local lease on the slots expired or was taken
VM_CREATE_FAILED = "VmCreateFailed"
IMAGE_NOT_FOUND = "ImageNotFound"
WIPE_FAILED = "WipeFailed"
SLOT_IN_USE = "SlotInUse"

# The allocation's own failures, as its run ends (workflows/allocation/failures.py)
SKU_UNAVAILABLE = "SkuUnavailable"
PLACEMENT_REFUSED = "PlacementRefused"
DEADLINE_EXCEEDED = "DeadlineExceeded"
QUEUE_TIMEOUT = "QueueTimeout"  # waited in its region's queue past its timeout
