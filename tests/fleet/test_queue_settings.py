"""The fleet file's queueing settings: PriorityClass documents, a tenant's weight, priorityClasses and
queue, a region's queueingStrategy; their defaults, and the problems an operator is shown for each mistake."""

from __future__ import annotations

import pytest

from contracts.vocabulary import QueueingStrategy
from fleet.errors import FleetError
from fleet.loader import load_fleet, parse_fleet
from fleet.tenant import DEFAULT_MAX_QUEUE_SECONDS
from scheduler.from_fleet import snapshot_from_fleet

REGION = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: r1}
spec: {status: available}
"""

SETTINGS = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: r1}
spec: {status: available, queueingStrategy: StrictFIFO}
---
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: r2}
spec: {status: available}
---
apiVersion: berth.dev/v1alpha1
kind: PriorityClass
metadata: {name: urgent}
spec: {value: 1000, description: production inference}
---
apiVersion: berth.dev/v1alpha1
kind: PriorityClass
metadata: {name: batch}
spec: {value: -10, default: true}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: acme}
spec:
  gpuQuota: 16
  weight: 2.5
  priorityClasses: [urgent, batch]
  queue: {defaultTimeout: 30m, maxTimeout: 1h30m}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: globex}
spec: {gpuQuota: 8}
"""


def parse(text: str) -> object:
    return parse_fleet([("fleet.yaml", text)])


def problems(text: str) -> list[tuple[str, str | None, str]]:
    """(object, field path, message) of each problem the fleet file has."""
    with pytest.raises(FleetError) as caught:
        parse(text)
    return [(f"{p.kind}/{p.name}", p.path, p.message) for p in caught.value.problems]


def tenant(spec: str, name: str = "acme") -> str:
    return f"---\napiVersion: berth.dev/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def priority_class(name: str, spec: str) -> str:
    return f"---\napiVersion: berth.dev/v1alpha1\nkind: PriorityClass\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def test_the_settings_are_read_with_durations_in_seconds() -> None:
    fleet = parse(SETTINGS)
    assert fleet.regions["r1"].spec.queueing_strategy is QueueingStrategy.STRICT_FIFO
    urgent, batch = fleet.priority_classes["urgent"].spec, fleet.priority_classes["batch"].spec
    assert (urgent.value, urgent.default, urgent.description) == (1000, False, "production inference")
    assert (batch.value, batch.default, batch.description) == (-10, True, None)
    acme = fleet.tenants["acme"].spec
    assert acme.weight == 2.5
    assert acme.priority_classes == ["urgent", "batch"]
    assert (acme.queue.default_timeout, acme.queue.max_timeout) == (1800.0, 5400.0)


def test_unset_settings_take_their_defaults() -> None:
    fleet = parse(SETTINGS)
    assert fleet.regions["r2"].spec.queueing_strategy is QueueingStrategy.BEST_EFFORT_FIFO
    globex = fleet.tenants["globex"].spec
    assert globex.weight == 1.0
    assert globex.priority_classes is None  # every class
    assert globex.queue.default_timeout is None  # a request that does not ask does not wait
    assert globex.queue.max_timeout == DEFAULT_MAX_QUEUE_SECONDS == 7 * 24 * 3600
    assert parse(REGION + tenant("{gpuQuota: 1}")).priority_classes == {}


def test_the_snapshot_carries_weights_and_strategies() -> None:
    snapshot = snapshot_from_fleet(parse(SETTINGS))
    assert snapshot.tenants["acme"].weight == 2.5 and snapshot.tenants["globex"].weight == 1.0
    assert snapshot.regions["r1"].queueing_strategy is QueueingStrategy.STRICT_FIFO
    assert snapshot.regions["r2"].queueing_strategy is QueueingStrategy.BEST_EFFORT_FIFO


def test_the_settings_load_from_a_file(tmp_path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(SETTINGS)
    assert load_fleet([path]).tenants["acme"].spec.queue.default_timeout == 1800.0


def test_a_second_default_priority_class_is_refused_naming_the_first() -> None:
    text = (
        REGION
        + priority_class("high", "{value: 10, default: true}")
        + priority_class("low", "{value: 1, default: true}")
    )
    assert problems(text) == [
        ("PriorityClass/low", "spec.default", "PriorityClass 'high' is already the default; only one class may be")
    ]


def test_a_tenant_naming_an_undefined_priority_class_is_refused() -> None:
    text = REGION + priority_class("urgent", "{value: 10}") + tenant("{gpuQuota: 4, priorityClasses: [urgent, gold]}")
    assert problems(text) == [("Tenant/acme", "spec.priorityClasses[1]", "PriorityClass 'gold' is not defined")]


def test_a_default_timeout_longer_than_the_maximum_is_refused() -> None:
    text = REGION + tenant("{gpuQuota: 4, queue: {defaultTimeout: 2h, maxTimeout: 30m}}")
    assert problems(text) == [("Tenant/acme", "spec.queue", "defaultTimeout 2h0m0s is longer than maxTimeout 30m0s")]
    # Without a maximum, the default may be up to 7 days.
    assert parse(REGION + tenant("{gpuQuota: 4, queue: {defaultTimeout: 168h}}")).tenants["acme"].spec.queue
    assert problems(REGION + tenant("{gpuQuota: 4, queue: {defaultTimeout: 169h}}")) == [
        ("Tenant/acme", "spec.queue", "defaultTimeout 169h0m0s is longer than maxTimeout 168h0m0s")
    ]


def test_an_unknown_queueing_strategy_is_refused_with_the_known_ones() -> None:
    text = REGION.replace("{status: available}", "{status: available, queueingStrategy: FIFO}")
    assert problems(text) == [
        ("Region/r1", "spec.queueingStrategy", "Input should be 'StrictFIFO' or 'BestEffortFIFO'")
    ]


def test_a_negative_weight_is_refused_and_zero_means_always_last() -> None:
    """Kueue's fairSharing.weight: 0 is allowed (a queue that borrows with weight 0 goes after every other)."""
    assert problems(REGION + tenant("{gpuQuota: 4, weight: -1}")) == [
        ("Tenant/acme", "spec.weight", "Input should be greater than or equal to 0")
    ]
    assert parse(REGION + tenant("{gpuQuota: 4, weight: 0}")).tenants["acme"].spec.weight == 0


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ("{default: true}", "spec.value"),  # a class needs its value
        ("{value: 2000000000}", "spec.value"),  # above the user range
        ("{value: 1, preemption: Never}", "spec.preemption"),  # unknown fields are typos
    ],
)
def test_a_priority_class_without_a_usable_value_is_refused(spec: str, path: str) -> None:
    found = problems(REGION + priority_class("p", spec))
    assert [(where, at) for where, at, _ in found] == [("PriorityClass/p", path)]


def test_a_class_that_never_preempts_and_one_never_preempted_are_read() -> None:
    """Kubernetes' PriorityClass `preemptionPolicy` (PreemptLowerPriority, the default, or Never) and KAI's
    non-preemptible workloads (`nonPreemptible`)."""
    text = (
        REGION
        + priority_class("patient", "{value: 10, preemptionPolicy: Never}")
        + priority_class("pinned", "{value: 20, nonPreemptible: true}")
    )
    classes = parse(text).priority_classes
    assert (classes["patient"].spec.preemption_policy, classes["patient"].spec.non_preemptible) == ("Never", False)
    assert (classes["pinned"].spec.preemption_policy, classes["pinned"].spec.non_preemptible) == (
        "PreemptLowerPriority",
        True,
    )
    assert problems(REGION + priority_class("p", "{value: 1, preemptionPolicy: Sometimes}")) == [
        ("PriorityClass/p", "spec.preemptionPolicy", "Input should be 'PreemptLowerPriority' or 'Never'")
    ]


def test_a_class_both_preemptible_and_non_preemptible_is_refused() -> None:
    assert problems(REGION + priority_class("p", "{value: 1, preemptible: true, nonPreemptible: true}")) == [
        ("PriorityClass/p", "spec", "preemptible and nonPreemptible cannot both be true: a class is one or the other")
    ]


def test_a_lending_limit_above_the_quota_it_lends_from_is_refused() -> None:
    """Kueue's validation: lendingLimit may not exceed the nominal quota it bounds (it could never be reached)."""
    text = REGION + tenant("{gpuQuota: 4, lendingLimit: 5, quotas: [{product: H100, nominal: 2, lendingLimit: 3}]}")
    assert problems(text) == [
        ("Tenant/acme", "spec.lendingLimit", "5 is more than the gpuQuota it lends from (4)"),
        ("Tenant/acme", "spec.quotas[0].lendingLimit", "3 is more than the nominal it lends from (2)"),
    ]
    assert parse(REGION + tenant("{gpuQuota: 4, lendingLimit: 4}")).tenants["acme"].spec.lending_limit == 4


def cohort(name: str, spec: str) -> str:
    return f"---\napiVersion: berth.dev/v1alpha1\nkind: Cohort\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def test_a_cohort_tree_loads_and_a_flat_cohort_needs_no_cohort_object() -> None:
    """Kueue's Cohort objects with parentName; a cohort tenants name without one is a root of its own, as before."""
    fleet = parse(
        REGION
        + cohort("org", "{gpuQuota: 4, fairSharing: {enabled: true}}")
        + cohort("research", "{parentName: org, borrowingLimit: 8, lendingLimit: 0, fairSharing: {weight: 2}}")
        + tenant("{gpuQuota: 4, cohort: research}")
        + tenant("{gpuQuota: 4, cohort: flat}", name="other")
    )
    assert fleet.cohorts["research"].spec.parent_name == "org"
    assert fleet.cohorts["org"].spec.fair_sharing.enabled and fleet.cohorts["research"].spec.fair_sharing.weight == 2
    assert "flat" not in fleet.cohorts


@pytest.mark.parametrize(
    ("documents", "where", "message"),
    [
        (
            cohort("a", "{parentName: nowhere}"),
            ("Cohort/a", "spec.parentName"),
            "Cohort 'nowhere' is not defined (a parent must be a Cohort object)",
        ),
        (
            cohort("a", "{parentName: b}") + cohort("b", "{parentName: c}") + cohort("c", "{parentName: a}"),
            ("Cohort/a", "spec.parentName"),
            "parents form a cycle: a -> b -> c -> a",
        ),
        (cohort("a", "{parentName: a}"), ("Cohort/a", "spec.parentName"), "parents form a cycle: a -> a"),
        (
            cohort("a", "{gpuQuota: 2, lendingLimit: 3}"),
            ("Cohort/a", "spec.lendingLimit"),
            "3 is more than the gpuQuota it lends from (2)",
        ),
        (
            cohort("a", "{borrowingLimit: 3}"),
            ("Cohort/a", "spec.borrowingLimit"),
            "a borrowingLimit needs a parentName: a root cohort has nothing to borrow from",
        ),
        (
            cohort("root", "{}") + cohort("a", "{parentName: root, fairSharing: {enabled: true}}"),
            ("Cohort/a", "spec.fairSharing"),
            "fairSharing.enabled is set on a tree's root cohort: it decides for the whole tree, and this "
            "cohort has parentName 'root'",
        ),
        (
            cohort("a", "{fairSharing: {weight: -1}}"),
            ("Cohort/a", "spec.fairSharing.weight"),
            "Input should be greater than or equal to 0",
        ),
        (
            cohort("a", "{fairSharing: {enabled: true, usageHalfLife: 0s}}"),
            ("Cohort/a", "spec.fairSharing.usageHalfLife"),
            "Input should be greater than 0",
        ),
        (
            cohort("a", "{fairSharing: {enabled: true, usageHalfLife: -1h}}"),
            ("Cohort/a", "spec.fairSharing.usageHalfLife"),
            "'-1h' is not a duration (for example 90s, 15m or 1h30m)",
        ),
        (
            cohort("a", "{fairSharing: {usageHalfLife: 168h}}"),
            ("Cohort/a", "spec.fairSharing"),
            "usageHalfLife orders a fair-sharing tree: set enabled: true on this root cohort with it",
        ),
    ],
)
def test_a_bad_cohort_is_refused_naming_its_field(documents: str, where: tuple[str, str], message: str) -> None:
    """Kueue's validation of Cohorts: the parent exists, no cycle, a lendingLimit within the quota it lends from,
    a borrowingLimit only where there is a parent to borrow from."""
    found = problems(REGION + documents)
    assert (*where, message) in found, found
