"""A deployment's `modelCacheRef`: new replicas only where the referenced ModelCache stages, as Modelplane's
compose function does (functions/compose-model-deployment/function/fn.py, `resolve_cache_footprint`).

- The cache is found (in the deployment's namespace): its `clusterSelector.matchLabels` are merged into the
  deployment's own `clusterSelector` (both are ANDed label matches; the cache's value wins on a shared key), so the
  candidate clusters are where it stages. Berth adds one refinement for live objects: when the cache publishes
  `status.clusters[]`, a cluster where its phase is not Ready takes no new replica (a NoSchedule taint
  `berth.dev/model-cache-not-staged` the deployment cannot tolerate), while replicas already there stay.
- The cache is missing: every cluster takes a NoSchedule taint `berth.dev/model-cache-unresolved`, so existing
  replicas are retained and nothing new is placed; the status says so (`ModelCacheNotFound`, "ModelCache NAME not
  found; holding replica placement").

Taints are how Berth already keeps new replicas off a cluster without draining it, so retain, fill and the
per-cluster reasons need nothing new. A deployment tolerating every taint (`operator: Exists` with no key) would
tolerate these two as well; that is the one way around the gate, and a documented one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts.manifest import DEFAULT_NAMESPACE, TaintEffect
from fleet.deployment import ClusterSelector, ModelDeployment
from fleet.inference_cluster import InferenceCluster, Taint
from fleet.model_cache import ModelCache

NOT_STAGED_TAINT = "berth.dev/model-cache-not-staged"
UNRESOLVED_TAINT = "berth.dev/model-cache-unresolved"


@dataclass(frozen=True)
class CacheGate:
    deployment: ModelDeployment  # clusterSelector narrowed to the cache's footprint
    clusters: list[InferenceCluster]  # tainted where no new replica may go
    missing: str | None = None  # the referenced cache's name, when it cannot be found


def cache_key(namespace: str, name: str) -> str:
    """The fleet's key for a ModelCache (see `fleet.validate.object_key`)."""
    return name if namespace == DEFAULT_NAMESPACE else f"{namespace}/{name}"


def _tainted(cluster: InferenceCluster, taint: Taint) -> InferenceCluster:
    spec = cluster.spec.model_copy(update={"taints": [*cluster.spec.taints, taint]})
    return cluster.model_copy(update={"spec": spec})


def gate_on_cache(
    deployment: ModelDeployment, clusters: Iterable[InferenceCluster], caches: Mapping[str, ModelCache]
) -> CacheGate:
    clusters = list(clusters)
    ref = deployment.spec.template.spec.model_cache_ref
    if ref is None:
        return CacheGate(deployment=deployment, clusters=clusters)
    cache = caches.get(cache_key(deployment.namespace, ref.name))
    if cache is None:
        taint = Taint(key=UNRESOLVED_TAINT, value=ref.name, effect=TaintEffect.NO_SCHEDULE)
        return CacheGate(deployment=deployment, clusters=[_tainted(c, taint) for c in clusters], missing=ref.name)
    template_spec = deployment.spec.template.spec
    if cache.match_labels:
        own = template_spec.cluster_selector.match_labels if template_spec.cluster_selector else {}
        selector = ClusterSelector(match_labels={**own, **cache.match_labels})
        template_spec = template_spec.model_copy(update={"cluster_selector": selector})
        template = deployment.spec.template.model_copy(update={"spec": template_spec})
        spec = deployment.spec.model_copy(update={"template": template})
        deployment = deployment.model_copy(update={"spec": spec})
    staged = cache.staged_on()
    if staged is not None:
        taint = Taint(key=NOT_STAGED_TAINT, value=ref.name, effect=TaintEffect.NO_SCHEDULE)
        clusters = [c if c.metadata.name in staged else _tainted(c, taint) for c in clusters]
    return CacheGate(deployment=deployment, clusters=clusters)
