"""How a create waits in its region's queue for capacity: its queue timeout and priority, from the body and the fleet
file.

    body.queue.timeout, else the tenant's queue.defaultTimeout  -> none or 0: the request does not wait
                                                                -> over the tenant's queue.maxTimeout: 422
    body.priority_class, else the fleet's default PriorityClass -> unknown: 422 `unknown_priority_class`
                                                                -> not in the tenant's priorityClasses: 422
                                                                   `priority_class_not_allowed`
    -> workflows.allocation.messages.QueueWait (None: fails when nothing fits, as ever)

Whether a request that waits still gets the create's quota check is api/feasibility.py's `queue_ceiling`.
"""

from __future__ import annotations

from api.errors import ApiError
from contracts.durations import format_duration
from contracts.http import AllocationCreate
from fleet.tenant import DEFAULT_MAX_QUEUE_SECONDS
from store import queue
from store.db import AsyncSession
from store.models import TenantRow
from workflows.allocation.messages import QueueWait


async def queue_wait(session: AsyncSession, tenant: TenantRow, body: AllocationCreate) -> QueueWait | None:
    """The request's wait, or None when it does not wait; 422 naming the field when the fleet does not allow it."""
    policy = tenant.queue or {}
    longest = float(policy.get("max_timeout") or DEFAULT_MAX_QUEUE_SECONDS)
    timeout = body.queue.timeout if body.queue is not None else policy.get("default_timeout")
    priority, name = await _priority(session, tenant, body.priority_class)
    if not timeout:
        return None
    if timeout > longest:
        problem = {"field": "body.queue.timeout", "message": f"is longer than {format_duration(longest)}"}
        raise ApiError(
            422,
            "queue_timeout_too_long",
            f"tenant {tenant.name} may wait at most {format_duration(longest)} (its queue.maxTimeout); "
            f"{format_duration(float(timeout))} was asked",
            [problem],
        )
    return QueueWait(timeout_seconds=float(timeout), priority=priority, priority_class=name)


async def _priority(session: AsyncSession, tenant: TenantRow, asked: str | None) -> tuple[int, str | None]:
    classes = await queue.priority_classes(session)
    if asked is None:
        default = next((name for name, (_, is_default) in classes.items() if is_default), None)
        return (classes[default][0], default) if default is not None else (0, None)
    if asked not in classes:
        known = ", ".join(sorted(classes)) or "none are defined"
        problem = {"field": "body.priority_class", "message": f"is not a PriorityClass ({known})", "type": "unknown"}
        raise ApiError(422, "unknown_priority_class", f"PriorityClass {asked!r} does not exist", [problem])
    if tenant.priority_classes is not None and asked not in tenant.priority_classes:
        allowed = ", ".join(sorted(tenant.priority_classes)) or "none"
        problem = {"field": "body.priority_class", "message": f"is not one of the tenant's classes ({allowed})"}
        raise ApiError(
            422, "priority_class_not_allowed", f"tenant {tenant.name} may not use PriorityClass {asked!r}", [problem]
        )
    return classes[asked][0], asked


async def within_nominal(session: AsyncSession, asked: str | None) -> bool:
    """Whether the request's PriorityClass (the one it names, else the default) is `nonPreemptible`: such a request
    is admitted only within its tenant's nominal quota, never on borrowed GPUs."""
    _, fact = (await queue.class_facts(session)).of(asked)
    return bool(fact and fact.non_preemptible)
