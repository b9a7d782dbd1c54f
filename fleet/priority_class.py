"""PriorityClass: a named priority for allocations that wait for capacity.

Modelled on Kubernetes' PriorityClass (scheduling.k8s.io/v1: an integer `value`, at most one `globalDefault`), which
Kueue's workloads use too: a queued request with the higher value is admitted first, whatever its tenant's share.
A tenant may use the classes its `priorityClasses` lists (every class when unset); a create that names none gets
the default class, or priority 0 when the fleet has none.

    kind: PriorityClass
    metadata: {name: urgent}
    spec: {value: 1000, description: "production inference"}

Two more facts decide preemption. `preemptionPolicy: Never` (Kubernetes' field of the same name) makes a class that
never displaces anyone: its requests wait. `nonPreemptible: true` (KAI-Scheduler's non-preemptible workloads) makes
a class that is never displaced, and so is admitted only within its tenant's nominal quota, never on GPUs borrowed
from its cohort (which their owner may need back). `preemptible: true` (spot) is the other end: anyone may displace
it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from contracts.manifest import Spec
from contracts.vocabulary import ClassPreemptionPolicy
from fleet.deadlines import Duration
from fleet.meta import ObjectMeta

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
        "preemptible itself.",
    )
    grace_period: Duration = Field(
        default=30.0,
        description="How long an allocation of this class keeps running after its preemption notice (`30s`, `5m`).",
    )
    preemption_policy: ClassPreemptionPolicy = Field(
        default=ClassPreemptionPolicy.PREEMPT_LOWER_PRIORITY,
        description="`Never`: its queued requests displace nobody, whatever their tenant's preemption policy.",
    )
    non_preemptible: bool = Field(
        default=False,
        description="Never displaced by anyone; admitted only within its tenant's nominal quota, never on borrowed "
        "GPUs.",
    )

    @model_validator(mode="after")
    def _not_both_ends(self) -> PriorityClassSpec:
        if self.preemptible and self.non_preemptible:
            raise ValueError("preemptible and nonPreemptible cannot both be true: a class is one or the other")
        return self


class PriorityClass(Spec):
    api_version: str
    kind: Literal["PriorityClass"]
    metadata: ObjectMeta
    spec: PriorityClassSpec
