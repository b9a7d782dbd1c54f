"""Region: where capacity lives, whether it takes new work, what it costs, and which jurisdiction holds the data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from contracts.manifest import Spec
from contracts.vocabulary import QueueingStrategy, RegionStatus
from fleet.meta import ObjectMeta


class RegionSpec(Spec):
    status: RegionStatus = RegionStatus.AVAILABLE
    jurisdiction: str | None = Field(default=None, description="Data-residency jurisdiction, e.g. 'us' or 'eu'.")
    prices: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="Price per GPU-hour by GPU product (e.g. H200: 3.2)."
    )
    queueing_strategy: QueueingStrategy = Field(
        default=QueueingStrategy.BEST_EFFORT_FIFO,
        description="How the region's queue of waiting requests is walked: StrictFIFO or BestEffortFIFO.",
    )


class Region(Spec):
    api_version: str
    kind: Literal["Region"]
    metadata: ObjectMeta
    spec: RegionSpec = Field(default_factory=RegionSpec)
