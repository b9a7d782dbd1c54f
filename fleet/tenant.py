"""Tenant: who may ask for GPUs, in which regions, how many at once, and how fast it may ask."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from fleet.meta import Name, ObjectMeta, Spec


class TenantRateLimit(Spec):
    """A token bucket over the tenant's `POST /v1/allocations`: `burst` creates at once, then `createsPerSecond`.

    Each create costs a workflow, a row and a placement pass, so a tenant that floods creates slows everyone's
    placement; the bucket refuses the excess with 429 before anything is read or started. Kept per API process
    (api/rate_limit.py): with several API processes behind a balancer the tenant gets each one's allowance."""

    creates_per_second: PositiveFloat = Field(le=1_000_000, description="Tokens added per second (may be fractional).")
    burst: PositiveInt = Field(le=1_000_000, description="The bucket's size: creates allowed at once after a pause.")


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


class Tenant(Spec):
    api_version: str
    kind: Literal["Tenant"]
    metadata: ObjectMeta
    spec: TenantSpec
