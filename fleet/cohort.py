"""Cohort: a node of a tree of tenants that lend each other quota, as Kueue's Cohort object (`parentName`).

A tenant names its cohort (`cohort: team-a`); a cohort no Cohort object defines is a root with no quota of its own,
which is all a flat cohort is. A Cohort object gives it a parent, a quota of its own, limits on what it borrows from
its parent and lends to it, and, on a tree's root, whether fair sharing decides within the tree and which
fair-sharing preemption strategies it tries (scheduler/quota/cohorts.py has the arithmetic,
scheduler/quota/fair_sharing.py the shares).

    kind: Cohort
    metadata: {name: research}
    spec: {parentName: org, gpuQuota: 8, borrowingLimit: 16, fairSharing: {weight: 2}}

A root may order its tree by usage that remembers: `fairSharing: {enabled: true, usageHalfLife: 168h}`.

What a cohort's own quota means is its `quotaMode`:

- `Additive` (the default) is Kueue's Cohort: its `gpuQuota` is GPUs of its own, added to what its members' quotas
  give its subtree; its subtree may use all of that and borrow beyond it from its parent, up to a `borrowingLimit`.
- `Department` is KAI-Scheduler's department above its projects: its `gpuQuota` (and each of its `quotas`) is the
  most its whole subtree uses together. Its members borrow from each other within it, never beyond it, however much
  its parent has free; it adds no GPUs of its own. Its members' quotas may add up to more than it (KAI and Run:ai
  allow that, recommending that they do not): they then share it, and a member may find its own quota taken by the
  others until they release it or are preempted (`reclaimWithinCohort`).

    kind: Cohort
    metadata: {name: vision}
    spec: {parentName: org, quotaMode: Department, gpuQuota: 16}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, ValidationInfo, field_validator, model_validator

from contracts.manifest import Spec
from contracts.vocabulary import DEFAULT_FAIR_SHARING_STRATEGIES, CohortQuotaMode, FairSharingStrategy
from fleet.deadlines import Duration
from fleet.meta import Name, ObjectMeta
from fleet.tenant import FlavorQuota, _within

# The strategy lists Kueue's configuration accepts (its validation of `fairSharing.preemptionStrategies`).
VALID_STRATEGY_LISTS = (
    (FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,),
    (FairSharingStrategy.LESS_THAN_INITIAL_SHARE,),
    DEFAULT_FAIR_SHARING_STRATEGIES,
)


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
    preemption_strategies: tuple[FairSharingStrategy, ...] = Field(
        default=DEFAULT_FAIR_SHARING_STRATEGIES,
        description="With enabled, on a root: the rules a preemption in its tree tries, in order, to take another "
        "tenant's allocation (Kueue's fairSharing.preemptionStrategies); unset: Kueue's default, "
        "LessThanOrEqualToFinalShare then LessThanInitialShare.",
    )

    @field_validator("preemption_strategies")
    @classmethod
    def _strategies_of_a_sharing_tree(
        cls, strategies: tuple[FairSharingStrategy, ...], info: ValidationInfo
    ) -> tuple[FairSharingStrategy, ...]:
        """Checked only where written: unset, a root takes Kueue's default pair. A list nobody could act on (on a
        tree that does not share fairly), an empty one (no preemption could ever be justified) or one Kueue's
        configuration refuses is a mistake worth telling: Kueue accepts only the lists `VALID_STRATEGY_LISTS`, as
        its second phase only ever applies LessThanInitialShare (one allocation per tenant)."""
        if not info.data.get("enabled"):
            raise ValueError(
                "preemptionStrategies choose how a fair-sharing tree preempts: set enabled: true on this root cohort "
                "with them"
            )
        if not strategies:
            raise ValueError(
                "name at least one strategy, or leave preemptionStrategies unset for Kueue's default "
                f"[{', '.join(DEFAULT_FAIR_SHARING_STRATEGIES)}]"
            )
        if strategies not in VALID_STRATEGY_LISTS:
            named = "; ".join(f"[{', '.join(valid)}]" for valid in VALID_STRATEGY_LISTS)
            raise ValueError(
                f"[{', '.join(strategies)}] is not a list Kueue accepts: one of {named} (a second strategy is "
                "always LessThanInitialShare, tried once per tenant on what the first left)"
            )
        return strategies

    @model_validator(mode="after")
    def _decays_where_it_shares(self) -> CohortFairSharing:
        if self.usage_half_life is not None and not self.enabled:
            raise ValueError("usageHalfLife orders a fair-sharing tree: set enabled: true on this root cohort with it")
        return self


class CohortSpec(Spec):
    parent_name: Name | None = Field(default=None, description="The cohort above it; unset: it is a tree's root.")
    gpu_quota: NonNegativeInt = Field(
        default=0,
        description="Additive: GPUs of its own that its whole subtree may use, beyond its members' quotas. "
        "Department: the most GPUs its whole subtree uses together.",
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
    quota_mode: CohortQuotaMode = Field(
        default=CohortQuotaMode.ADDITIVE,
        description="Additive (Kueue's Cohort): its quota adds to its members'. Department (KAI-Scheduler's "
        "department): its gpuQuota, and each of its quotas, bounds what its whole subtree uses together.",
    )

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

    @field_validator("quota_mode")
    @classmethod
    def _a_department_has_a_bound(cls, mode: CohortQuotaMode, info: ValidationInfo) -> CohortQuotaMode:
        """A department is its bound: without a quota it would let its members use nothing. A borrowingLimit
        beside it would be a second bound on the same thing (what its subtree draws from its parent), so it is
        refused rather than silently combined."""
        if mode is not CohortQuotaMode.DEPARTMENT or not {"gpu_quota", "quotas", "borrowing_limit"} <= info.data.keys():
            return mode  # Additive, or a field it depends on is already reported
        quotas: list[FlavorQuota] = info.data["quotas"]
        if not info.data["gpu_quota"] and not quotas:
            raise ValueError(
                "quotaMode Department bounds what its members use together by its own quota: set gpuQuota (or quotas)"
            )
        borrowing = [
            q.product + (f" in {q.region}" if q.region else "") for q in quotas if q.borrowing_limit is not None
        ]
        if info.data["borrowing_limit"] is not None or borrowing:
            where = "borrowingLimit" + (f" (its quotas for {', '.join(borrowing)})" if borrowing else "")
            raise ValueError(f"a Department's quota already caps what its subtree draws from its parent: drop {where}")
        return mode


class Cohort(Spec):
    api_version: str
    kind: Literal["Cohort"]
    metadata: ObjectMeta
    spec: CohortSpec
