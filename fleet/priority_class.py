"""PriorityClass: a named priority for allocations that wait for capacity (issue 24).

Modelled on Kubernetes' PriorityClass (scheduling.k8s.io/v1: an integer `value`, at most one `globalDefault`), which
Kueue's workloads use too: a queued request with the higher value is admitted first, whatever its tenant's share.
A tenant may use the classes its `priorityClasses` lists (every class when unset); a create that names none gets
the default class, or priority 0 when the fleet has none.

    kind: PriorityClass
    metadata: {name: urgent}
    spec: {value: 1000, description: "production inference"}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleet.deadlines import Duration
from fleet.meta import ObjectMeta, Spec

# Kubernetes reserves values above 1,000,000,000 for system classes; Berth keeps to the user range.
MAX_PRIORITY = 1_000_000_000


class PriorityClassSpec(Spec):
    value: int = Field(
        ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="Higher is admitted first; requests without a class get 0."
    )
    default: bool = Field(
        default=False, description="The class of requests that name none (at most one class may be the default)."
    )
    description: str | None = Field(default=None, max_length=1024)
    preemptible: bool = Field(
        default=False,
        description="Spot: a running allocation of this class may be displaced by any queued request that is not "
        "preemptible itself (issue 26).",
    )
    grace_period: Duration = Field(
        default=30.0,
        description="How long an allocation of this class keeps running after its preemption notice (`30s`, `5m`).",
    )


class PriorityClass(Spec):
    api_version: str
    kind: Literal["PriorityClass"]
    metadata: ObjectMeta
    spec: PriorityClassSpec
