"""How an allocation's steps fail: an attempt's reason, and the allocation's own failure types.

An attempt on one node fails with a reason code (topology-specific where the node gave one) and the workflow moves
to the next candidate; a `final` failure (quota, a deadline) ends the whole allocation once the attempt is
compensated. The failure types are what `GET /v1/allocations/{id}` and the Temporal UI show as the run's failure.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from contracts.failures import (
    IMAGE_NOT_FOUND,
    LEASE_LOST,
    SKU_UNAVAILABLE,
    VM_CREATE_FAILED,
    WIPE_FAILED,
)

# A node agent's error types as an attempt's reason codes.
_NODE_CODES = {
    VM_CREATE_FAILED: "vm_create_failed",
    LEASE_LOST: "lease_lost",
    IMAGE_NOT_FOUND: "image_not_found",
    WIPE_FAILED: "wipe_failed",
}


class AttemptFailed(Exception):
    """One candidate did not work out. `final` (an error type) ends the whole allocation once the attempt is
    compensated, instead of moving to the next node."""

    def __init__(self, code: str, message: str, final: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.final = final

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.message}"

    def ending(self) -> ApplicationError:
        """The allocation's own failure, for a final one."""
        return ApplicationError(self.reason, type=self.final or SKU_UNAVAILABLE, non_retryable=True)


def past_overall_timeout(error: ActivityError) -> bool:
    """The step ran out of its state's deadline (given to it as its schedule-to-close timeout)."""
    return isinstance(error.cause, TimeoutError) and error.cause.type == TimeoutType.SCHEDULE_TO_CLOSE


def as_activity_error(activity: str) -> ActivityError:
    """A local activity's failure as an activity's: the SDK hands a local activity's non-retryable failure over
    bare, where an activity's comes wrapped; every caller here reads `ActivityError.cause`, whichever way it ran
    (the bare error is chained as the cause)."""
    return ActivityError(
        f"local activity {activity} failed",
        scheduled_event_id=0,
        started_event_id=0,
        identity="",
        activity_type=activity,
        activity_id="",
        retry_state=None,
    )


def node_failure(error: ActivityError, node: str) -> AttemptFailed:
    """Turn an activity failure on a node into an attempt's reason."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START:
        return AttemptFailed("agent_unreachable", f"the node agent of {node} did not pick the task up")
    if isinstance(cause, TimeoutError):
        return AttemptFailed("agent_timeout", f"the node agent of {node} stopped answering ({cause.type.name})")
    if isinstance(cause, ApplicationError):
        return AttemptFailed(_NODE_CODES.get(cause.type or "", "node_error"), cause.message)
    return AttemptFailed("node_error", str(cause or error))
