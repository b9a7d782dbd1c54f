"""Pool feasibility (cluster scheduler, first half): which pools of the chosen region can serve the request.

Filter plugins (see `scheduler.placement.plugins`), each returning the reason it drops a pool: capacity shape, GPU product,
cluster matchLabels, cluster readiness, DRA CEL selectors over the GPU devices the pool's InferenceClass
publishes, the pool's longest lease (`maxLease`) against the request's, and the tenant's quota for the pool's product in its region. A pool passes the selectors when one of its claimable devices satisfies all of them (DRA semantics: the
selectors of one request apply to the same device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.durations import format_duration
from contracts.explanation import Level, LevelExplanation
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from scheduler import cel
from scheduler.explanation import Tally
from scheduler.placement.plugins import Filter, first_failure
from scheduler.quota import accounts as quota
from scheduler.snapshot import PoolClass, Snapshot
from scheduler.views import PoolView


@dataclass(frozen=True)
class ShapeFilter:
    request: PlacementRequest

    def check(self, pool: PoolView) -> Reason | None:
        return None if pool.shape == self.request.shape else Reason.SHAPE_MISMATCH


@dataclass(frozen=True)
class ProductFilter:
    request: PlacementRequest

    def check(self, pool: PoolView) -> Reason | None:
        return None if self.request.wants_product(pool.gpu_product) else Reason.PRODUCT_MISMATCH


@dataclass(frozen=True)
class ClusterLabelsFilter:
    """matchLabels: every selector label present with the same value; no selector matches every cluster."""

    request: PlacementRequest

    def check(self, pool: PoolView) -> Reason | None:
        labels = pool.cluster_labels
        matches = all(labels.get(key) == value for key, value in self.request.cluster_selector.items())
        return None if matches else Reason.CLUSTER_LABELS_MISMATCH


@dataclass(frozen=True)
class ClusterReadyFilter:
    def check(self, pool: PoolView) -> Reason | None:
        return None if pool.cluster_ready else Reason.CLUSTER_NOT_READY


@dataclass
class DeviceSelectorFilter:
    """Every selector is evaluated against every device (no short cut), so the CEL work per request is exactly the
    distinct (selector, device) pairs the first time, and cached lookups afterwards (`scheduler.cel` remembers
    each outcome by device content, shared by all pools of a class)."""

    snapshot: Snapshot
    expressions: Sequence[str]
    errors: dict[str, str] = field(default_factory=dict)  # pool key -> why its selectors could not be evaluated

    def __post_init__(self) -> None:
        self._selectors = [cel.compile_selector(expression) for expression in self.expressions]

    def check(self, pool: PoolView) -> Reason | None:
        if not self._selectors:
            return None
        error: str | None = None
        for device in self.snapshot.devices(pool):
            outcomes = [self._outcome(selector, device) for selector in self._selectors]
            if all(outcome is True for outcome in outcomes):
                return None
            error = error or next((outcome for outcome in outcomes if isinstance(outcome, str)), None)
        if error is None:
            return Reason.SELECTOR_MISMATCH
        self.errors[pool.key] = error
        return Reason.SELECTOR_ERROR

    @staticmethod
    def _outcome(selector: cel.Selector, device: object) -> bool | str:
        """True or False, or the runtime error's message."""
        try:
            return selector.matches(device)
        except cel.SelectorRuntimeError as exc:
            return str(exc)


@dataclass
class LeaseFilter:
    """A request with an end goes only to pools whose `maxLease` is at least as long."""

    request: PlacementRequest
    messages: dict[str, str] = field(default_factory=dict)  # pool key -> the two durations

    def check(self, pool: PoolView) -> Reason | None:
        wanted, most = self.request.lease_seconds, pool.max_lease_seconds
        if wanted is None or most is None or wanted <= most:
            return None
        self.messages[pool.key] = f"leases of at most {format_duration(most)}; asked {format_duration(wanted)}"
        return Reason.LEASE_TOO_LONG


@dataclass
class QuotaFilter:
    """A tenant with per-product quotas may be placed only on pools whose product, in their region, its
    quota (with what its cohort lends) still has room for: Kueue's flavor assignment, pool by pool."""

    snapshot: Snapshot
    request: PlacementRequest
    messages: dict[str, str] = field(default_factory=dict)  # pool key -> why its quota refuses

    def __post_init__(self) -> None:
        self._tenant = self.snapshot.tenants.get(self.request.tenant or "")

    def check(self, pool: PoolView) -> Reason | None:
        if self._tenant is None or self._tenant.quotas is None or pool.gpu_product is None:
            return None
        decision = quota.decide_flavor(
            self._tenant,
            pool.gpu_product,
            pool.region,
            self.request.gpu_count,
            self.snapshot.tenants.values(),
            cohorts=self.snapshot.cohorts,
        )
        if decision.fits:
            return None
        self.messages[pool.key] = decision.message
        return Reason.QUOTA_EXCEEDED


def filter_pools(
    snapshot: Snapshot, request: PlacementRequest, region: str, *, detail: bool = False
) -> tuple[list[PoolView], LevelExplanation]:
    """The pools of `region` that can serve the request, in snapshot order, and the pool level's explanation.

    Raises `scheduler.cel.SelectorCompileError` for a selector that does not compile: that is a bad request, not
    a placement outcome.
    """
    classes, level = judge_pool_classes(snapshot, request, region, detail=detail)
    pools = snapshot.pools_in(region)
    if len(classes) == len(snapshot.pool_classes(region)):
        return list(pools), level
    if not classes:
        return [], level
    passed = {pool_class.id for pool_class in classes}
    return [pool for pool in pools if snapshot.pool_class(pool.key).id in passed], level


def judge_pool_classes(
    snapshot: Snapshot, request: PlacementRequest, region: str, *, detail: bool = False
) -> tuple[list[PoolClass], LevelExplanation]:
    """The pool classes of `region` whose pools can serve the request, and the pool level's explanation.

    Every filter looks only at what makes a pool's class (`scheduler.snapshot.PoolClass`: shape, product, cluster
    labels and readiness, longest lease, devices by content, region), so each class is judged once, on its first
    pool, in the order of the classes' first pools: the CEL work charged and any budget exceeded are the same as
    judging every pool in snapshot order. A new filter must look at nothing else (or widen `_class_key`).
    """
    selectors = DeviceSelectorFilter(snapshot, request.selectors)
    quotas = QuotaFilter(snapshot, request)
    leases = LeaseFilter(request)
    plugins: list[Filter[PoolView]] = [
        ShapeFilter(request),
        ProductFilter(request),
        ClusterLabelsFilter(request),
        ClusterReadyFilter(),
        selectors,
        leases,
        quotas,  # last: a pool refused only by the quota is one the request may wait for
    ]
    tally = Tally(Level.POOL, "pools", "match", request.gpu_count, detail)
    classes = snapshot.pool_classes(region)
    verdicts: dict[int, Reason | None] = {}
    messages: dict[int, str] = {}
    passed: list[PoolClass] = []
    for pool_class in classes:
        first = pool_class.pool
        reason = verdicts[pool_class.id] = first_failure(first, plugins)
        if reason is None:
            passed.append(pool_class)
        else:
            message = (
                selectors.errors.get(first.key) or leases.messages.get(first.key) or quotas.messages.get(first.key)
            )
            if message is not None:
                messages[pool_class.id] = message
        if not detail:
            tally.add(reason, len(pool_class.pools))
    if detail:
        for pool in snapshot.pools_in(region):
            class_id = snapshot.pool_class(pool.key).id
            reason = verdicts[class_id]
            tally.record(reason, [pool.key], _describe, pool, reason, messages.get(class_id, ""))
    return passed, tally.explanation()


def _describe(pool: PoolView, reason: Reason | None, message: str) -> str:
    text = f"{pool.shape} {pool.gpu_product or 'unknown product'}, cluster {pool.cluster}"
    if not pool.cluster_ready:
        text += " (not Ready)"
    if reason in (Reason.SELECTOR_ERROR, Reason.QUOTA_EXCEEDED, Reason.LEASE_TOO_LONG):
        text += f": {message}"
    return text
