"""Control activities may run twice (a worker dies after the work, before Temporal hears of it): the second run
must change nothing. Against the real database."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, update
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.control.claims import ClaimActivities
from activities.control.records import RecordActivities
from contracts.allocation import AllocationRecord, AuditTrail, ClaimInput, ReleaseClaimsInput, StateChange
from contracts.placement import Bundle, PlacementRequest
from devstack.reports import report_hosts
from fleet.loader import load_fleet
from store.apply import apply_fleet
from store.models import AllocationEventRow, ClaimRow, SlotRow, TenantRow


def _bundle(index: int) -> Bundle:
    return Bundle(
        slot_id=f"j22u05/{index}",
        slot_index=index,
        gpu_pci="0000:1b:00.0",
        fabric_parent_pci=None,
        fabric_vf_pci=None,
        nvme_device=None,
        numa_node=0,
        vcpu_count=1,
        memory_mib=1,
        mac_address=None,
        private_ip=None,
    )


def opening(allocation: str, gpus: int, tenant: str = "acme") -> AllocationRecord:
    """The first record of an allocation (its row, in state pending: in flight)."""
    return AllocationRecord(
        allocation_id=allocation,
        tenant=tenant,
        workflow_id=f"allocation/{allocation}",
        request=PlacementRequest(gpu_count=gpus),
    )


async def _example_fleet(
    sessions, examples_dir, **acme: object
) -> tuple[ActivityEnvironment, RecordActivities, ClaimActivities]:  # type: ignore[no-untyped-def]
    """The example fleet applied (tenant acme's row changed by `acme`), its hosts reported, and the activities."""
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
        if acme:
            await session.execute(update(TenantRow).where(TenantRow.name == "acme").values(**acme))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    return ActivityEnvironment(), RecordActivities(sessions), ClaimActivities(sessions)


async def test_a_claim_is_all_or_nothing_and_a_refused_claim_keeps_its_story(sessions, examples_dir) -> None:
    """The claim is one statement: a slot taken or missing refuses the whole claim, names the slot, and leaves every
    slot as it was; the steps the refused claim carried are written all the same (the allocation's story)."""
    env, records, claims = await _example_fleet(sessions, examples_dir)
    for allocation in ("holder", "late"):
        record = opening(allocation, gpus=2)
        await env.run(records.record_trail, AuditTrail(opening=record))
    held = ClaimInput(
        allocation_id="holder", attempt=1, node="j22u05", tenant="acme", gpu_count=1, bundles=[_bundle(1)]
    )
    await env.run(claims.record_claims, held)

    step = StateChange(
        allocation_id="late", run_id="r1", state="claiming", step="record_claims", attempt=1, node="j22u05"
    )
    late = ClaimInput(
        allocation_id="late",
        attempt=1,
        node="j22u05",
        tenant="acme",
        gpu_count=2,
        bundles=[_bundle(0), _bundle(1)],
        trail=AuditTrail(changes=[step]),
    )
    with pytest.raises(ApplicationError) as taken:
        await env.run(claims.record_claims, late)
    assert taken.value.type == "ClaimConflict"
    assert taken.value.message == "slots [1] of j22u05 are already reserved or quarantined"
    with pytest.raises(ApplicationError) as missing:
        await env.run(claims.record_claims, late.model_copy(update={"bundles": [_bundle(0), _bundle(99)]}))
    assert missing.value.message == "slots [99] of j22u05 are not in the inventory"

    async with sessions() as session:
        states = dict(
            (
                await session.execute(
                    select(SlotRow.slot_index, SlotRow.state).where(SlotRow.node_id == "j22u05", SlotRow.slot_index < 2)
                )
            ).all()
        )
        claimed = (await session.scalars(select(ClaimRow.allocation_id))).all()
        steps = (
            await session.scalars(select(AllocationEventRow.step).where(AllocationEventRow.allocation_id == "late"))
        ).all()
    assert states == {0: "available", 1: "reserved"} and claimed == ["holder"]
    assert "record_claims" in steps


async def test_claims_and_records_are_idempotent_and_conflicts_are_typed(sessions, examples_dir) -> None:
    env, records, claims = await _example_fleet(sessions, examples_dir)
    for allocation in ("a", "b"):
        record = opening(allocation, gpus=2)
        await env.run(records.record_trail, AuditTrail(opening=record))
        await env.run(records.record_trail, AuditTrail(opening=record))
    change = StateChange(
        allocation_id="a", run_id="r1", state="claiming", step="record_claims", attempt=1, node="j22u05"
    )
    await env.run(records.record_trail, AuditTrail(changes=[change]))
    await env.run(records.record_trail, AuditTrail(changes=[change]))

    claim = ClaimInput(
        allocation_id="a", attempt=1, node="j22u05", tenant="acme", gpu_count=2, bundles=[_bundle(0), _bundle(1)]
    )
    first = await env.run(claims.record_claims, claim)
    assert await env.run(claims.record_claims, claim) == first

    with pytest.raises(ApplicationError) as conflict:
        await env.run(claims.record_claims, claim.model_copy(update={"allocation_id": "b"}))
    assert conflict.value.type == "ClaimConflict" and conflict.value.non_retryable

    assert await env.run(claims.release_claims, ReleaseClaimsInput(allocation_id="a")) == 2
    assert await env.run(claims.release_claims, ReleaseClaimsInput(allocation_id="a")) == 0
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AllocationEventRow)) == 1
        assert await session.scalar(select(func.count()).select_from(ClaimRow)) == 2
        states = (await session.scalars(select(SlotRow.state).where(SlotRow.node_id == "j22u05"))).all()
    assert set(states) == {"available"}


async def test_quota_is_rechecked_when_claiming(sessions, examples_dir) -> None:
    env, records, claims = await _example_fleet(sessions, examples_dir)
    big = AllocationRecord(allocation_id="big", tenant="globex", workflow_id="w", request=PlacementRequest(gpu_count=9))
    await env.run(records.record_trail, AuditTrail(opening=big))
    with pytest.raises(ApplicationError, match=r"would exceed its GPU quota: .* > quota 8") as refused:
        await env.run(
            claims.record_claims,
            ClaimInput(
                allocation_id="big", attempt=1, node="j22u05", tenant="globex", gpu_count=9, bundles=[_bundle(0)]
            ),
        )
    assert refused.value.type == "QuotaExceeded"


async def test_a_products_quota_in_a_region_is_rechecked_when_claiming(sessions, examples_dir) -> None:
    """Two placements decided on one snapshot cannot both take the last of a tenant's H200 quota in us-east: the
    claim re-checks it under the tenant's lock, against the claims' node's product and region."""
    quota = {"product": "H200", "region": "us-east", "nominal": 3, "borrowing_limit": None, "lending_limit": None}
    env, records, claims = await _example_fleet(sessions, examples_dir, quotas=[quota])
    for allocation, slots in (("first", [0, 1]), ("second", [2, 3])):
        record = opening(allocation, gpus=2)
        await env.run(records.record_trail, AuditTrail(opening=record))
        change = StateChange(
            allocation_id=allocation, run_id="r1", state="claiming", step="record_claims", attempt=1, node="j22u05"
        )
        await env.run(records.record_trail, AuditTrail(changes=[change]))
        claim = ClaimInput(
            allocation_id=allocation,
            attempt=1,
            node="j22u05",
            tenant="acme",
            gpu_count=2,
            bundles=[_bundle(i) for i in slots],
        )
        if allocation == "first":
            await env.run(claims.record_claims, claim)
    with pytest.raises(ApplicationError) as refused:
        await env.run(claims.record_claims, claim)
    assert refused.value.type == "QuotaExceeded"
    assert refused.value.message == "tenant acme would exceed its H200 in us-east quota: 2 held + 2 requested > quota 3"
