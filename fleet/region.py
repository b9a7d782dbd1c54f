"""Region: where capacity lives, whether it takes new work, what it costs, and which jurisdiction holds the data."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, PositiveFloat

from fleet.meta import ObjectMeta, Spec


class RegionStatus(StrEnum):
    AVAILABLE = "available"
    DEGRADED = "degraded"  # still placeable, ranked after available regions
    UNAVAILABLE = "unavailable"  # never chosen; a request naming it is refused with region_unavailable


class RegionSpec(Spec):
    status: RegionStatus = RegionStatus.AVAILABLE
    jurisdiction: str | None = Field(default=None, description="Data-residency jurisdiction, e.g. 'us' or 'eu'.")
    prices: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="Price per GPU-hour by GPU product (e.g. H200: 3.2)."
    )


class Region(Spec):
    api_version: str
    kind: Literal["Region"]
    metadata: ObjectMeta
    spec: RegionSpec = Field(default_factory=RegionSpec)
