"""Nominal quotas per GPU product and region (scheduler/quota/accounts.py): Kueue's nominal quota per resource
flavor, with cohorts that borrow and lend the same product's quota, judged by the whole placement pipeline on a
fleet file with two regions and two products."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from fleet.loader import FleetError, parse_fleet
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.placement.region import waiting_region
from scheduler.placement.schedule import schedule
from scheduler.quota import accounts as quota
from scheduler.snapshot import Snapshot
from scheduler.views import FlavorQuotaView, TenantView

API = "berth.dev/v1alpha1"
# region -> product -> node: one 8-GPU node of each product in each region
NODES = {("east", "H100"): "e-h100", ("east", "H200"): "e-h200", ("west", "H100"): "w-h100", ("west", "H200"): "w-h200"}


def fleet_documents(tenants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = [
        {"apiVersion": API, "kind": "Region", "metadata": {"name": region}, "spec": {"prices": {"H100": p, "H200": p}}}
        for region, p in (("east", 2.0), ("west", 3.0))
    ]
    documents += [
        {"apiVersion": API, "kind": "Tenant", "metadata": {"name": name}, "spec": spec}
        for name, spec in tenants.items()
    ]
    documents += [
        {
            "apiVersion": API,
            "kind": "InferenceClass",
            "metadata": {"name": product.lower()},
            "spec": {"devices": [{"name": "gpu", "driver": "gpu.nvidia.com", "count": 8}]},
        }
        for product in ("H100", "H200")
    ]
    for region in ("east", "west"):
        pools = [
            {
                "name": product.lower(),
                "className": product.lower(),
                "shape": "gpu_slice",
                "gpuProduct": product,
                "nodeTemplate": {
                    "count": 1,
                    "namePrefix": f"{NODES[(region, product)]}-",
                    "gpusPerNode": 8,
                    "numaNodes": 1,
                },
            }
            for product in ("H100", "H200")
        ]
        documents.append(
            {
                "apiVersion": API,
                "kind": "InferenceCluster",
                "metadata": {"name": f"{region}-1"},
                "spec": {"region": region, "nodePools": pools},
            }
        )
    return documents


def world(tenants: dict[str, dict[str, Any]], holds: dict[str, tuple[str, int]] | None = None) -> Snapshot:
    """`holds`: tenant -> (node prefix, GPUs) it holds there, claimed."""
    documents = fleet_documents(tenants)
    allocations = [
        {
            "id": f"held-{tenant}",
            "tenant": tenant,
            "state": "claimed",
            "slots": [f"{prefix}-01/{i}" for i in range(gpus)],
        }
        for tenant, (prefix, gpus) in (holds or {}).items()
    ]
    if allocations:
        documents.append(
            {"apiVersion": API, "kind": "SlotState", "metadata": {"name": "now"}, "spec": {"allocations": allocations}}
        )
    fleet = parse_fleet([("fleet.yaml", yaml.safe_dump_all(documents))])
    return snapshot_from_fleet(fleet, fleet.slot_states.values())


def ask(snapshot: Snapshot, gpus: int, tenant: str = "acme", **fields: Any) -> tuple[str | None, str | None, str]:
    """(node, refusal code, refusal message) of placing the request now."""
    result = schedule(snapshot, PlacementRequest(gpu_count=gpus, tenant=tenant, **fields))
    if result.refusal is not None:
        return None, result.refusal.code, result.refusal.message
    assert result.plan is not None
    return result.plan.node, None, ""


def test_a_tenant_with_product_quotas_is_placed_only_on_the_products_they_name() -> None:
    snapshot = world({"acme": {"gpuQuota": 64, "quotas": [{"product": "H200", "nominal": 4}]}})
    node, _, _ = ask(snapshot, 2)  # H100 in east would be as cheap, but acme has no H100 quota
    assert node == "e-h200-01"
    _, code, message = ask(snapshot, 2, gpu_product="H100")
    assert code == Reason.QUOTA_EXCEEDED
    assert message == "tenant acme has no quota for 2 H100 GPU slices (its quotas: H200)"


def test_when_one_products_quota_is_used_up_the_request_goes_to_a_product_with_quota_left() -> None:
    tenants = {
        "acme": {"gpuQuota": 64, "quotas": [{"product": "H200", "nominal": 4}, {"product": "H100", "nominal": 8}]}
    }
    node, _, _ = ask(world(tenants, {"acme": ("e-h200", 3)}), 2)
    assert node == "e-h100-01"  # 3 of 4 H200 held: 2 more only fit the H100 quota
    _, code, message = ask(world(tenants, {"acme": ("e-h200", 3)}), 2, gpu_product="H200")
    assert code == Reason.QUOTA_EXCEEDED
    assert message == "tenant acme would exceed its H200 quota: 3 held + 2 requested > quota 4"


def test_a_regional_quota_counts_only_that_regions_gpus_and_sends_the_request_where_it_has_room() -> None:
    tenants = {
        "acme": {
            "gpuQuota": 64,
            "quotas": [
                {"product": "H200", "region": "east", "nominal": 2},
                {"product": "H200", "region": "west", "nominal": 8},
            ],
        }
    }
    node, _, _ = ask(world(tenants, {"acme": ("e-h200", 2)}), 4)
    assert node == "w-h200-01"  # east is cheaper, but its H200 quota is used up
    _, code, message = ask(world(tenants, {"acme": ("e-h200", 2)}), 4, region="east")
    assert code == Reason.QUOTA_EXCEEDED
    assert message == "tenant acme would exceed its H200 in east quota: 2 held + 4 requested > quota 2"


def test_a_quota_over_every_region_counts_the_gpus_held_in_all_of_them() -> None:
    tenants = {"acme": {"gpuQuota": 64, "quotas": [{"product": "H200", "nominal": 6}]}}
    _, code, _ = ask(world(tenants, {"acme": ("w-h200", 4)}), 4, region="east")
    assert code == Reason.QUOTA_EXCEEDED
    assert ask(world(tenants, {"acme": ("w-h200", 4)}), 2, region="east")[0] == "e-h200-01"


def test_the_total_gpu_quota_still_caps_every_product_together() -> None:
    tenants = {
        "acme": {"gpuQuota": 4, "quotas": [{"product": "H200", "nominal": 8}, {"product": "H100", "nominal": 8}]}
    }
    _, code, message = ask(world(tenants, {"acme": ("e-h100", 3)}), 2, gpu_product="H200")
    assert code == Reason.QUOTA_EXCEEDED
    assert message == "tenant acme would exceed its GPU quota: 3 active + 0 in flight + 2 requested > quota 4"


def test_a_cohort_lends_a_products_quota_only_to_the_same_products_quota() -> None:
    tenants = {
        "acme": {"gpuQuota": 64, "cohort": "lab", "quotas": [{"product": "H200", "nominal": 2}]},
        "h200-lender": {
            "gpuQuota": 64,
            "cohort": "lab",
            "quotas": [{"product": "H200", "nominal": 4, "lendingLimit": 3}],
        },
        "h100-lender": {"gpuQuota": 64, "cohort": "lab", "quotas": [{"product": "H100", "nominal": 16}]},
    }
    snapshot = world(tenants)
    assert ask(snapshot, 5, gpu_product="H200")[0] == "e-h200-01"  # 2 own + 3 lent
    _, code, message = ask(snapshot, 6, gpu_product="H200")
    assert code == Reason.QUOTA_EXCEEDED
    assert message.endswith("and cohort lab has 3 GPUs left to lend (4 needed)")  # the H100 lender lends no H200


def test_borrowing_beyond_a_products_nominal_quota_is_what_the_allocation_is_marked_with() -> None:
    acme = TenantView(
        name="acme",
        gpu_quota=100,
        cohort="lab",
        quotas=(FlavorQuotaView("H200", None, 2, borrowing_limit=2),),
        held=(("H200", "east", 1),),
        active_gpus=1,
    )
    lender = TenantView(name="lender", gpu_quota=100, cohort="lab", quotas=(FlavorQuotaView("H200", None, 8),))
    placed = quota.decide_placement(acme, "H200", "west", 3, [acme, lender])
    assert placed.fits and placed.borrowed == 2  # within the total, 2 beyond its H200 quota
    refused = quota.decide_placement(acme, "H200", "west", 4, [acme, lender])
    assert refused.message.endswith("and 3 beyond it is more than its borrowingLimit 2")


def test_a_request_over_its_products_quota_waits_only_if_that_quota_could_ever_hold_it() -> None:
    tenants = {
        "acme": {"gpuQuota": 64, "quotas": [{"product": "H200", "nominal": 4}, {"product": "H100", "nominal": 8}]}
    }
    snapshot = world(tenants, {"acme": ("e-h200", 4)})
    request = PlacementRequest(gpu_count=4, tenant="acme", gpu_product="H200")
    assert waiting_region(snapshot, request) == "east"
    assert waiting_region(snapshot, request.model_copy(update={"gpu_count": 5})) is None  # H200 quota is 4
    acme = snapshot.tenants["acme"]
    assert quota.ceiling(acme, snapshot.tenants.values(), lambda product: product == "H200") == 4
    assert quota.ceiling(acme, snapshot.tenants.values()) == 8


def test_explain_names_each_pool_the_quota_refuses_and_why() -> None:
    tenants = {
        "acme": {
            "gpuQuota": 64,
            "quotas": [
                {"product": "H200", "region": "east", "nominal": 2},
                {"product": "H100", "region": "east", "nominal": 8},
            ],
        }
    }
    snapshot = world(tenants, {"acme": ("e-h200", 2)})
    result = schedule(snapshot, PlacementRequest(gpu_count=2, tenant="acme", region="east"), detail=True)
    assert result.plan is not None and result.plan.node == "e-h100-01"
    pools = next(level for level in result.explanation.levels if level.level == "pool")
    verdicts = {item.name: (item.reason, item.detail) for item in pools.items or []}
    assert verdicts["east-1/h200"] == (
        Reason.QUOTA_EXCEEDED,
        "gpu_slice H200, cluster east-1: tenant acme would exceed its H200 in east quota: 2 held + 2 requested > quota 2",
    )
    assert verdicts["east-1/h100"][0] is None


@pytest.mark.parametrize(
    ("quotas", "message"),
    [
        (
            [{"product": "H200", "nominal": 2}, {"product": "h200", "nominal": 4}],
            "quotas: h200 (every region) is given twice",
        ),
        (
            [{"product": "H200", "nominal": 2}, {"product": "H200", "region": "east", "nominal": 4}],
            "quotas: H200 has a quota for every region and one for a single region; give one or the other",
        ),
    ],
)
def test_a_product_has_one_quota_per_place(quotas: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(FleetError) as invalid:
        parse_fleet([("fleet.yaml", yaml.safe_dump_all(fleet_documents({"acme": {"gpuQuota": 8, "quotas": quotas}})))])
    assert message in str(invalid.value)


def test_a_quota_for_a_region_the_fleet_does_not_define_is_refused() -> None:
    quotas = [{"product": "H200", "region": "north", "nominal": 2}]
    with pytest.raises(FleetError) as invalid:
        parse_fleet([("fleet.yaml", yaml.safe_dump_all(fleet_documents({"acme": {"gpuQuota": 8, "quotas": quotas}})))])
    assert "spec.quotas[0].region" in str(invalid.value) and "region 'north' is not defined" in str(invalid.value)
