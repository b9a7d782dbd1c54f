"""Tenant: who may ask for GPUs, in which regions, and how many at once."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt

from fleet.meta import Name, ObjectMeta, Spec


class TenantSpec(Spec):
    allowed_regions: list[Name] | None = Field(
        default=None, description="Regions this tenant may use; unset means every region."
    )
    gpu_quota: NonNegativeInt = Field(description="Most GPUs the tenant may hold active or in flight at once.")
    required_jurisdiction: str | None = Field(
        default=None, description="When set, every allocation of this tenant must stay in this jurisdiction."
    )


class Tenant(Spec):
    api_version: str
    kind: Literal["Tenant"]
    metadata: ObjectMeta
    spec: TenantSpec
