"""The one toleration matcher against Kubernetes' documented rules (the taint-and-toleration page and `ToleratesTaint`
in k8s.io/api/core/v1/toleration.go), and the one Toleration model's serialized form, which the cluster driver's
payloads and pod manifests carry unchanged."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.cluster import ClusterConnection, ClusterTarget
from contracts.manifest import TaintEffect, Toleration
from fleet.inference_cluster import Taint
from scheduler.deployment.tolerations import tolerates

GPU = Taint(key="gpu", value="h200", effect=TaintEffect.NO_SCHEDULE)
GPU_EVICT = Taint(key="gpu", value="h200", effect=TaintEffect.NO_EXECUTE)
KEY_ONLY = Taint(key="dedicated", effect=TaintEffect.NO_SCHEDULE)


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        # An empty effect matches every effect; a set one only its own.
        (dict(key="gpu", operator="Exists"), GPU_EVICT, True),
        (dict(key="gpu", operator="Exists", effect="NoSchedule"), GPU, True),
        (dict(key="gpu", operator="Exists", effect="NoSchedule"), GPU_EVICT, False),
        (dict(key="gpu", operator="Exists", effect="PreferNoSchedule"), GPU, False),
        # Exists with an empty key matches every key and value (within its effect, when set).
        (dict(operator="Exists"), GPU, True),
        (dict(operator="Exists"), KEY_ONLY, True),
        (dict(operator="Exists", effect="NoExecute"), GPU, False),
        # Exists with a key matches any value of that key, and no other key.
        (dict(key="gpu", operator="Exists"), GPU, True),
        (dict(key="other", operator="Exists"), GPU, False),
        # Equal (the default) matches the key and the value; an unset value is the empty one.
        (dict(key="gpu", value="h200"), GPU, True),
        (dict(key="gpu", operator="Equal", value="h100"), GPU, False),
        (dict(key="other", operator="Equal", value="h200"), GPU, False),
        (dict(key="gpu", operator="Equal"), GPU, False),
        (dict(key="dedicated", operator="Equal"), KEY_ONLY, True),
        (dict(key="dedicated", operator="Equal", value=""), KEY_ONLY, True),
        (
            dict(key="dedicated", operator="Equal", value=""),
            Taint(key="dedicated", value="", effect="NoSchedule"),
            True,
        ),
    ],
)
def test_kubernetes_matching_rules(toleration: dict[str, str], taint: Taint, tolerated: bool) -> None:
    assert tolerates(Toleration(**toleration), taint) is tolerated


def test_an_operator_kubernetes_does_not_know_tolerates_nothing() -> None:
    """The difference found: the cluster driver's own matcher read any operator but Exists as Equal, so a
    toleration `gpu Gt h200` tolerated the taint gpu=h200; Kubernetes' `ToleratesTaint` tolerates nothing with an
    operator it does not know (Lt and Gt only behind a feature gate). The one model refuses such an operator, and
    the matcher, handed one anyway, tolerates nothing."""
    with pytest.raises(ValidationError):
        Toleration(key="gpu", operator="Gt", value="h200")
    unknown = Toleration.model_construct(key="gpu", operator="Gt", value="h200", effect=None)
    assert not tolerates(unknown, GPU)


def test_tolerations_kubernetes_refuses_are_refused() -> None:
    with pytest.raises(ValidationError, match="an Equal toleration must set a key"):
        Toleration(operator="Equal", value="h200")
    with pytest.raises(ValidationError, match="an Exists toleration must not set a value"):
        Toleration(key="gpu", operator="Exists", value="h200")


def test_a_taint_from_the_api_server_is_read_into_the_one_model() -> None:
    raw = {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute", "timeAdded": "2025-01-01T00:00:00Z"}
    taint = Taint.from_api(raw)
    assert (taint.key, taint.value, taint.effect) == ("node.kubernetes.io/out-of-service", None, TaintEffect.NO_EXECUTE)
    assert tolerates(Toleration(key="node.kubernetes.io/out-of-service", operator="Exists"), taint)
    assert not tolerates(Toleration(key="node.kubernetes.io/out-of-service", value="x"), taint)


def test_the_driver_toleration_is_the_one_model_and_serializes_as_before() -> None:
    assert ClusterTarget.model_fields["tolerations"].annotation == list[Toleration]
    exists = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    equal = Toleration(key="maintenance", value="soon", effect="NoExecute")
    # A pod spec's form: unset fields left out, plain strings.
    assert exists.manifest() == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert equal.manifest() == {"key": "maintenance", "operator": "Equal", "value": "soon", "effect": "NoExecute"}
    assert all(type(v) is str for v in exists.manifest().values())
    # The payload's form: the same four fields, by the same names, and back again.
    target = ClusterTarget(connection=ClusterConnection(method="in-cluster"), tolerations=[exists, equal])
    dumped = target.model_dump(mode="json")
    assert dumped["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "value": None, "effect": "NoSchedule"},
        {"key": "maintenance", "operator": "Equal", "value": "soon", "effect": "NoExecute"},
    ]
    assert ClusterTarget.model_validate(dumped) == target
    assert ClusterTarget.model_validate_json(target.model_dump_json()) == target
