"""ModelCache: a model's weights staged on a set of clusters, in Modelplane's shape (its XRD, field for field).

Read: `metadata.namespace` (default "default"; a deployment's `modelCacheRef` names a cache in its own namespace),
`spec.clusterSelector.matchLabels` (the clusters the cache stages to; unset: every cluster) and, on a live object,
`status.clusters[]` (`name`, `phase`: Pending, Hydrating, Ready or Failed): where it is staged now. Carried:
`spec.source`, `spec.huggingFace`, `spec.crossplane`, the rest of `status` (conditions, summary).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from contracts.manifest import Spec
from fleet.deployment import ClusterSelector
from fleet.meta import Carried, ObjectMeta


class SecretKeyRef(Spec):
    name: str = Field(min_length=1)
    key: str = "HF_TOKEN"


class HuggingFaceSource(Spec):
    repo: str = Field(min_length=1)
    revision: str | None = None
    auth_secret: SecretKeyRef | None = None
    size_gi_b: PositiveInt = Field(alias="sizeGiB", le=100000)


class ModelCacheSpec(Spec):
    crossplane: Carried | None = None
    source: Literal["HuggingFace"]
    hugging_face: HuggingFaceSource | None = None
    cluster_selector: ClusterSelector | None = None


CachePhase = Literal["Pending", "Hydrating", "Ready", "Failed"]


class CacheClusterStatus(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    phase: CachePhase | None = None
    message: str | None = None


class ModelCacheStatus(BaseModel):
    """What Modelplane's controller publishes; other status fields (conditions, summary) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    clusters: list[CacheClusterStatus] | None = None


class ModelCache(Spec):
    api_version: str
    kind: Literal["ModelCache"]
    metadata: ObjectMeta
    spec: ModelCacheSpec
    status: ModelCacheStatus | None = None

    @property
    def namespace(self) -> str:
        return self.metadata.namespace_or_default

    @property
    def match_labels(self) -> dict[str, str]:
        return dict(self.spec.cluster_selector.match_labels) if self.spec.cluster_selector else {}

    def staged_on(self) -> set[str] | None:
        """Clusters where the cache is Ready, per its published status; None when it publishes no per-cluster
        status (a file written by hand), in which case its clusterSelector alone says where it stages."""
        if self.status is None or self.status.clusters is None:
            return None
        return {c.name for c in self.status.clusters if c.phase == "Ready"}
