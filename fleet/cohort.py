"""Cohort: a node of a tree of tenants that lend each other quota, as Kueue's Cohort object (`parentName`).

A tenant names its cohort (`cohort: team-a`); a cohort no Cohort object defines is a root with no quota of its own,
which is all a flat cohort is. A Cohort object gives it a parent, a quota of its own that its whole subtree shares,
limits on what it borrows from its parent and lends to it, and, on a tree's root, whether fair sharing decides
within the tree (scheduler/quota/cohorts.py has the arithmetic, scheduler/quota/fair_sharing.py the shares).

    kind: Cohort
    metadata: {name: research}
    spec: {parentName: org, gpuQuota: 8, borrowingLimit: 16, fairSharing: {weight: 2}}

A root may order its tree by usage that remembers: `fairSharing: {enabled: true, usageHalfLife: 168h}`.

KAI-Scheduler's department -> project queues are the same picture: the department is a cohort with a parent-less
quota, its projects the tenants under it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, ValidationInfo, field_validator, model_validator

from contracts.manifest import Spec
from fleet.deadlines import Duration
from fleet.meta import Name, ObjectMeta
from fleet.tenant import FlavorQuota, _within


class CohortFairSharing(Spec):
    """Kueue's fair sharing, switched per tree (off by default, as in Kueue)."""

    enabled: bool = Field(
        default=False,
        description="On a root cohort only: queued requests of its tree are ordered, and preempt, by Kueue's fair "
        "sharing (dominant resource shares, compared between siblings at each level) instead of the classic rules.",
    )
    weight: NonNegativeFloat = Field(
        default=1.0, le=1_000_000, description="This cohort's weight among its siblings; 0: always last."
    )
    usage_half_life: Duration | None = Field(
        default=None,
        description="With enabled, on a root: order its queued requests (and choose fair-sharing victims) by each "
        "tenant's GPU-seconds decayed with this half-life (`168h`: a week ago counts half), over its weight, as "
        "Kueue's admission fair sharing and Slurm's PriorityDecayHalfLife; unset: by what each holds now.",
    )

    @model_validator(mode="after")
    def _decays_where_it_shares(self) -> CohortFairSharing:
        if self.usage_half_life is not None and not self.enabled:
            raise ValueError("usageHalfLife orders a fair-sharing tree: set enabled: true on this root cohort with it")
        return self


class CohortSpec(Spec):
    parent_name: Name | None = Field(default=None, description="The cohort above it; unset: it is a tree's root.")
    gpu_quota: NonNegativeInt = Field(
        default=0, description="GPUs of its own that its whole subtree may use, beyond its members' quotas."
    )
    borrowing_limit: NonNegativeInt | None = Field(
        default=None,
        description="Most GPUs its subtree may draw from its parent beyond what it puts there; unset: no limit.",
    )
    lending_limit: NonNegativeInt | None = Field(
        default=None, description="Most of its own gpuQuota its parent's other subtrees may borrow; unset: all of it."
    )

    _lends_at_most_its_quota = field_validator("lending_limit")(
        lambda limit, info: _within(limit, info, "gpu_quota", "gpuQuota")
    )
    quotas: list[FlavorQuota] = Field(
        default_factory=list, description="Its own quotas per GPU product (and region), as a tenant's `quotas`."
    )
    fair_sharing: CohortFairSharing = Field(default_factory=CohortFairSharing)

    @field_validator("borrowing_limit")
    @classmethod
    def _borrows_only_from_a_parent(cls, limit: int | None, info: ValidationInfo) -> int | None:
        """Kueue refuses a borrowing limit where there is nothing to borrow from."""
        if limit is not None and info.data.get("parent_name") is None:
            raise ValueError("a borrowingLimit needs a parentName: a root cohort has nothing to borrow from")
        return limit

    @field_validator("fair_sharing")
    @classmethod
    def _switched_on_the_root(cls, fair: CohortFairSharing, info: ValidationInfo) -> CohortFairSharing:
        parent = info.data.get("parent_name")
        if fair.enabled and parent is not None:
            raise ValueError(
                "fairSharing.enabled is set on a tree's root cohort: it decides for the whole tree, and this cohort "
                f"has parentName {parent!r}"
            )
        return fair


class Cohort(Spec):
    api_version: str
    kind: Literal["Cohort"]
    metadata: ObjectMeta
    spec: CohortSpec
