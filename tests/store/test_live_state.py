"""The live state every placement decision reads, in one statement: claims, slot states, tenant usage, the plans in
progress and the breaker's recent failures, each as the placement path needs it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from fleet.loader import parse_fleet
from scheduler.breaker import BreakerPolicy
from store import queue
from store.apply import apply_fleet
from store.models import AllocationEventRow, AllocationRow, ClaimRow, QueueEntryRow, SlotRow, TenantRow
from store.snapshot import TenantUsage, load_live_state, tenant_usage
from tests.workflows.lab import lab_fleet


def _allocation(ident: str, state: str, gpus: int, node: str | None = None, tenant: str = "acme") -> AllocationRow:
    return AllocationRow(
        id=ident,
        tenant=tenant,
        state=state,
        shape="gpu_slice",
        gpu_count=gpus,
        request={},
        workflow_id=f"allocation/{ident}",
        node_id=node,
    )


async def test_one_read_returns_every_part_of_the_live_state(sessions) -> None:
    now = datetime.now(UTC)
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("f.yaml", lab_fleet({"h1": {"gpus": 4}, "h2": {"gpus": 4}}))]))
        slots = {
            (n, i): ident
            for ident, n, i in await session.execute(select(SlotRow.id, SlotRow.node_id, SlotRow.slot_index))
        }
        session.add(TenantRow(name="other", gpu_quota=100))
        await session.flush()
        session.add_all(
            [
                _allocation("held", "active", 2, "h1"),
                _allocation("gone", "released", 1, "h1"),
                _allocation("planning-b", "planning", 1, "h2"),
                _allocation("planning-a", "claiming", 2, "h2"),
                _allocation("me", "planning", 1, "h2"),
                _allocation("placing", "placing", 3, tenant="other"),
            ]
        )
        await session.flush()
        session.add_all(
            [
                ClaimRow(allocation_id="held", attempt=1, slot_id=slots[("h1", 0)], node_id="h1", bundle={}),
                ClaimRow(allocation_id="held", attempt=1, slot_id=slots[("h1", 1)], node_id="h1", bundle={}),
                ClaimRow(
                    allocation_id="gone", attempt=1, slot_id=slots[("h1", 2)], node_id="h1", bundle={}, released_at=now
                ),
            ]
        )
        await session.execute(update(SlotRow).where(SlotRow.id == slots[("h2", 3)]).values(state="quarantined"))
        for n, (node, reason) in enumerate(
            [
                ("h1", "vm_create_failed: boom"),
                ("h2", "claim_conflict: lost a race"),
                ("h2", None),
                ("h1", "claimXconflict: not the code"),
            ]
        ):
            session.add(
                AllocationEventRow(
                    allocation_id="gone",
                    event_key=f"e{n}",
                    state="placing",
                    step="attempt_failed",
                    node_id=node,
                    reason=reason,
                    at=now - timedelta(minutes=1),
                )
            )
        session.add(
            AllocationEventRow(
                allocation_id="gone",
                event_key="old",
                state="placing",
                step="attempt_failed",
                node_id="h2",
                reason="vm_create_failed",
                at=now - timedelta(hours=2),
            )
        )

    policy = BreakerPolicy(threshold=2)
    async with sessions() as session:
        live = await load_live_state(session, exclude_allocation="me", breaker=policy, now=now)
        without_plans = await load_live_state(session, pending=False, breaker=BreakerPolicy(threshold=0), now=now)

    assert live.holders == {slots[("h1", 0)]: "held", slots[("h1", 1)]: "held"}  # released claims are not held
    assert live.unavailable == {slots[("h2", 3)]: "quarantined"}
    # `me` is left out of its own request's usage; GPUs placed on a node count for its product and region
    assert live.usage == {
        "acme": TenantUsage(active=2, in_flight=3, held=(("H200", "lab", 5),)),
        "other": TenantUsage(active=0, in_flight=3),
    }
    assert live.plans == {"h2": [("planning-a", 2), ("planning-b", 1)]}  # in id order, without `me`
    # h1: its own failure and one whose reason only looks like a claim conflict; h2: the unexplained one only
    assert {node: c.failures for node, c in live.cooling.items()} == {"h1": 2}
    assert without_plans.plans == {} and without_plans.cooling == {}
    assert {t: (u.active, u.in_flight) for t, u in without_plans.usage.items()} == {"acme": (2, 4), "other": (0, 3)}


async def test_a_woken_request_counts_once_while_it_places_itself(sessions) -> None:
    """A pass set node h1 aside for `woken` and woke it: its row says `placing` until its placement takes the entry
    out of the queue. Its 2 GPUs count once, on h1's product and region, in every decision's usage and in the claim's
    quota check; counted twice, a pass in that window would refuse its tenant's next request for quota."""
    async with sessions.begin() as session:
        await apply_fleet(session, parse_fleet([("f.yaml", lab_fleet({"h1": {"gpus": 4}}))]))
        session.add(_allocation("woken", "placing", 2))
        await session.flush()
        await queue.enter(
            session,
            allocation_id="woken",
            tenant="acme",
            region="lab",
            priority=0,
            priority_class=None,
            request={"gpu_count": 2},
            gpu_count=2,
            deadline_at=datetime.now(UTC) + timedelta(hours=1),
            reason="waiting",
            code="insufficient_capacity",
        )
        await session.execute(update(QueueEntryRow).where(QueueEntryRow.allocation_id == "woken").values(node="h1"))
    async with sessions() as session:
        live = await load_live_state(session, breaker=BreakerPolicy(threshold=0), now=datetime.now(UTC))
        checked = await tenant_usage(session)
    expected = TenantUsage(active=0, in_flight=2, held=(("H200", "lab", 2),))
    assert live.usage == {"acme": expected}
    assert checked == {"acme": expected}
