"""Tenant: who may ask for GPUs, in which regions, how many at once, and how fast it may ask."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contracts.durations import format_duration
from contracts.manifest import Spec
from contracts.vocabulary import BorrowWithinCohort, ReclaimWithinCohort, WithinTenant
from fleet.deadlines import Duration
from fleet.meta import Name, ObjectMeta

DEFAULT_MAX_QUEUE_SECONDS = 7 * 24 * 3600.0  # the longest wait a request may ask for when the tenant sets none


def _within(limit: int | None, info: ValidationInfo, bound: str, shown: str) -> int | None:
    """Kueue refuses a lendingLimit above the nominal quota it lends from (`bound`, written `shown`): it could never
    be reached."""
    quota = info.data.get(bound)
    if limit is not None and quota is not None and limit > quota:
        raise ValueError(f"{limit} is more than the {shown} it lends from ({quota})")
    return limit


class TenantRateLimit(Spec):
    """A token bucket over the tenant's `POST /v1/allocations`: `burst` creates at once, then `createsPerSecond`.

    Each create costs a workflow, a row and a placement pass, so a tenant that floods creates slows everyone's
    placement; the bucket refuses the excess with 429 before anything is read or started. Kept per API process
    (api/rate_limit.py): with several API processes behind a balancer the tenant gets each one's allowance."""

    creates_per_second: PositiveFloat = Field(le=1_000_000, description="Tokens added per second (may be fractional).")
    burst: PositiveInt = Field(le=1_000_000, description="The bucket's size: creates allowed at once after a pause.")


class TenantQueue(Spec):
    """How this tenant's requests wait for capacity. A request asks to wait with `queue: {timeout}`; with
    `defaultTimeout` set, a request that says nothing waits that long (one that asks `timeout: 0` does not wait)."""

    default_timeout: Duration | None = Field(
        default=None, description="How long a request that does not say waits; unset: it does not wait."
    )
    max_timeout: Duration = Field(
        default=DEFAULT_MAX_QUEUE_SECONDS, description="The longest wait a request may ask for (default 7 days)."
    )

    @model_validator(mode="after")
    def _default_within_max(self) -> TenantQueue:
        if self.default_timeout is not None and self.default_timeout > self.max_timeout:
            raise ValueError(
                f"defaultTimeout {format_duration(self.default_timeout)} is longer than maxTimeout "
                f"{format_duration(self.max_timeout)}"
            )
        return self


class FlavorQuota(Spec):
    """A nominal quota for one GPU product, in one region or in every region: Kueue's nominalQuota of
    one resource flavor. A tenant with `quotas` may be placed only on a product (and region) one of them names."""

    product: str = Field(min_length=1, max_length=64, description="The GPU product, as pools name it (`gpuProduct`).")
    region: Name | None = Field(default=None, description="The region it applies to; unset: every region, together.")
    nominal: NonNegativeInt = Field(description="GPUs of this product (in this region) the tenant may hold at once.")
    borrowing_limit: NonNegativeInt | None = Field(
        default=None, description="Most GPUs of it beyond `nominal` it may borrow from its cohort; unset: no limit."
    )
    lending_limit: NonNegativeInt | None = Field(
        default=None, description="Most of its unused `nominal` the rest of its cohort may borrow; unset: all of it."
    )

    _lends_at_most_its_nominal = field_validator("lending_limit")(
        lambda limit, info: _within(limit, info, "nominal", "nominal")
    )

    def covers(self, product: str, region: str) -> bool:
        return self.product.casefold() == product.casefold() and self.region in (None, region)

    def describe(self) -> str:
        return f"{self.product} in {self.region}" if self.region else f"{self.product} (every region)"


class BorrowWithinCohortSpec(Spec):
    policy: BorrowWithinCohort = Field(default=BorrowWithinCohort.NEVER)
    max_priority_threshold: int | None = Field(
        default=None, description="Only allocations of at most this priority may be displaced while borrowing."
    )


class TenantPreemption(Spec):
    """What this tenant's queued requests may displace to be placed (Kueue's ClusterQueue `preemption`). Nothing
    by default; a `preemptible` PriorityClass's allocations may be displaced by anyone whatever this says."""

    within_tenant: WithinTenant = Field(
        default=WithinTenant.NEVER,
        description="The tenant's own running allocations: `LowerPriority`, or `LowerOrNewerEqualPriority` (also "
        "equal priorities started after the request).",
    )
    reclaim_within_cohort: ReclaimWithinCohort = Field(
        default=ReclaimWithinCohort.NEVER,
        description="Other tenants' allocations that borrow in its cohort: `LowerPriority` or `Any`.",
    )
    borrow_within_cohort: BorrowWithinCohortSpec = Field(
        default_factory=BorrowWithinCohortSpec,
        description="When the request would still borrow once placed: `LowerPriority` lets it displace lower "
        "priorities (up to maxPriorityThreshold); `Never` (the default) does not.",
    )


class TenantSpec(Spec):
    allowed_regions: list[Name] | None = Field(
        default=None, description="Regions this tenant may use; unset means every region."
    )
    gpu_quota: NonNegativeInt = Field(description="Most GPUs the tenant may hold active or in flight at once.")
    required_jurisdiction: str | None = Field(
        default=None, description="When set, every allocation of this tenant must stay in this jurisdiction."
    )
    rate_limit: TenantRateLimit | None = Field(
        default=None, description="Creates per second and burst for this tenant; unset means no limit."
    )
    weight: NonNegativeFloat = Field(
        default=1.0,
        le=1_000_000,
        description="Fair-sharing weight (Kueue's fairSharing.weight), where its cohort tree shares fairly: its share "
        "of what the cohort lends, divided by this, orders and preempts; 0: always last.",
    )
    priority_classes: list[Name] | None = Field(
        default=None, description="PriorityClasses this tenant's requests may name; unset means every class."
    )
    queue: TenantQueue = Field(default_factory=TenantQueue, description="Waiting for capacity.")
    cohort: Name | None = Field(
        default=None,
        description="Tenants of one cohort lend each other the part of their gpuQuota they do not use; unset: the "
        "quota is a hard cap.",
    )
    borrowing_limit: NonNegativeInt | None = Field(
        default=None, description="Most GPUs beyond its gpuQuota it may borrow from its cohort; unset: no limit."
    )
    lending_limit: NonNegativeInt | None = Field(
        default=None, description="Most of its unused gpuQuota the rest of its cohort may borrow; unset: all of it."
    )

    _lends_at_most_its_quota = field_validator("lending_limit")(
        lambda limit, info: _within(limit, info, "gpu_quota", "gpuQuota")
    )
    quotas: list[FlavorQuota] | None = Field(
        default=None,
        description="Nominal quotas per GPU product (and region), within gpuQuota; unset: gpuQuota alone. With them "
        "set, a product (or region) none of them names is not the tenant's to use.",
    )
    preemption: TenantPreemption = Field(
        default_factory=TenantPreemption, description="What its queued requests may displace."
    )

    @model_validator(mode="after")
    def _one_quota_per_flavor(self) -> TenantSpec:
        """A product has one quota over every region, or one per region: never both, never two for one place, so
        each placement is charged to exactly one of them."""
        seen: dict[str, set[str | None]] = {}
        for quota in self.quotas or []:
            regions = seen.setdefault(quota.product.casefold(), set())
            if quota.region in regions:
                raise ValueError(f"quotas: {quota.describe()} is given twice")
            if regions and (quota.region is None or None in regions):
                raise ValueError(
                    f"quotas: {quota.product} has a quota for every region and one for a single region; give one "
                    "or the other"
                )
            regions.add(quota.region)
        return self


class Tenant(Spec):
    api_version: str
    kind: Literal["Tenant"]
    metadata: ObjectMeta
    spec: TenantSpec
