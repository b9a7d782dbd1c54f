"""What a claim records as borrowed: its own part of its tenant's excess over its quota, counting the GPUs its tenant
holds when the claim is made, not other requests still being placed (they count for the quota check itself, which
keeps them from taking the last headroom together, but each records its own part when its own claim is made).
Against the real database."""

from __future__ import annotations

from sqlalchemy import select, update
from temporalio.testing import ActivityEnvironment

from activities.control.claims import ClaimActivities
from activities.control.records import RecordActivities
from contracts.allocation import AuditTrail, ClaimInput
from devstack.reports import report_hosts
from fleet.loader import load_fleet
from store.apply import apply_fleet
from store.models import AllocationRow, TenantRow
from tests.activities.test_control_idempotency import _bundle, opening


async def test_two_requests_placed_at_once_record_the_tenants_real_excess_between_them(sessions, examples_dir) -> None:
    # acme owns 1 GPU of quota in cohort shared, where globex lends 8; two 1-GPU requests are being placed at once.
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([examples_dir / "fleet.yaml"]))
        await session.execute(update(TenantRow).where(TenantRow.name == "acme").values(gpu_quota=1, cohort="shared"))
        await session.execute(update(TenantRow).where(TenantRow.name == "globex").values(cohort="shared"))
    await report_hosts(sessions, load_fleet([examples_dir / "fleet.yaml"]))
    env, records, claims = ActivityEnvironment(), RecordActivities(sessions), ClaimActivities(sessions)
    for allocation in ("first", "second"):
        await env.run(records.record_trail, AuditTrail(opening=opening(allocation, gpus=1)))

    for index, allocation in enumerate(("first", "second")):
        claim = ClaimInput(
            allocation_id=allocation, attempt=1, node="j22u05", tenant="acme", gpu_count=1, bundles=[_bundle(index)]
        )
        await env.run(claims.record_claims, claim)

    async with sessions() as session:
        borrowed = dict((await session.execute(select(AllocationRow.id, AllocationRow.borrowed_gpus))).all())
    # The first claim takes acme's own GPU; the second is the one beyond its quota: 1 borrowed in all, as it is.
    assert (borrowed["first"], borrowed["second"]) == (0, 1)
