"""Feasibility at create time: what placement would refuse anyway is refused before anything exists (docs/seeds.md,
"Refusing at create what can never fit"), so a refused create leaves no workflow and no row behind.

"Never" means no host of the asked shape and product (in the asked region) has that many GPUs at all, whatever is
claimed, cordoned or down right now: those requests would only start a workflow that fails at its first step, and
under a burst they would queue behind the region's placement lock for an answer already known. What merely does
not fit now still becomes an allocation, which fails with `insufficient_capacity` and its explanation.

    the API's inventory cache -> largest host per (region, product, shape), kept per snapshot -> 422 `unsatisfiable`

A request the tenant's quota cannot hold now (GPUs active and in flight plus the request over `gpuQuota`) is
refused too, 409 `quota_exceeded` with the message placement would have failed it with: otherwise a burst of such
creates each became a workflow and a row, only to fail. 409, not 422: the request is valid and may pass once the
tenant releases GPUs, as `invalid_state` answers an action the object's current state does not allow. The arithmetic
is the region scheduler's own (`scheduler.placement.region.quota_refusal`) over the tenant's usage read now.
Placement stays the authority: two creates racing may both pass here and one then fails `quota_exceeded` as before.

    tenants' policy from the inventory cache + usage (one GROUP BY) -> quota_refusal -> 409 `quota_exceeded`

A request that waits in its region's queue skips the quota check when it alone could fit the most its tenant could
ever hold (`queue_ceiling`): it waits for GPUs to come back. A larger one is refused as before, since waiting could
never get it placed.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from api.errors import ApiError
from contracts.http import AllocationCreate
from contracts.placement import PlacementRequest
from scheduler.placement.region import quota_refusal
from scheduler.quota import accounts as quota
from scheduler.snapshot import Snapshot
from store.db import AsyncSession
from store.models import TenantRow
from store.snapshot import NO_USAGE, tenant_usage

Shape = tuple[str, str, str]  # (region, product casefolded, shape)


class _Largest:
    """The most GPUs one host offers, per (region, product, shape), for the snapshot last seen: the inventory cache
    hands out the same snapshot object until the fleet changes, so identity tells whether it is still current."""

    snapshot: Snapshot | None = None
    largest: dict[Shape, int] = {}

    def of(self, snapshot: Snapshot) -> dict[Shape, int]:
        if self.snapshot is not snapshot:
            largest: dict[Shape, int] = defaultdict(int)
            for pool in snapshot.pools:
                key = (pool.region, (pool.gpu_product or "").casefold(), pool.shape.value)
                for name in pool.nodes:
                    largest[key] = max(largest[key], len(snapshot.nodes[name].slots))
            self.snapshot, self.largest = snapshot, dict(largest)
        return self.largest


_largest = _Largest()


def check_satisfiable(snapshot: Snapshot, body: AllocationCreate) -> None:
    """422 `unsatisfiable` when no host could ever hold the request; `details` name the largest host of each
    product and region of the asked shape, so the caller sees what could be asked instead. Pinned nodes are judged
    by the pinned-node checks of the placement itself."""
    if body.nodes:
        return
    shape = body.shape.value
    product = (body.gpu_product or "").casefold()
    offers = {
        key: gpus
        for key, gpus in _largest.of(snapshot).items()
        if key[2] == shape and (body.region is None or key[0] == body.region) and (not product or key[1] == product)
    }
    if any(gpus >= body.gpu_count for gpus in offers.values()):
        return
    most = max(offers.values(), default=0)
    where = f" in {body.region}" if body.region else ""
    what = f"{body.gpu_product} " if body.gpu_product else ""
    details = [
        {"region": region, "gpu_product": snapshot_product or None, "shape": shape, "largest_host_gpus": gpus}
        for (region, snapshot_product, _shape), gpus in sorted(offers.items())
    ]
    raise ApiError(
        422,
        "unsatisfiable",
        f"no {shape} host{where} has {body.gpu_count} {what}GPUs (the largest has {most}); the fleet could never "
        "hold this request",
        details,
    )


async def check_quota(
    session: AsyncSession, snapshot: Snapshot, body: AllocationCreate, within_nominal: bool = False
) -> None:
    """409 `quota_exceeded` when the tenant's quotas cannot hold the request now. `snapshot` gives the tenants'
    policy (the inventory cache's, which a fleet apply refreshes); their usage is read here, in the caller's session.

    The create route asks this of a request that does not wait, and of one that waits but could never fit its
    quotas (`queue_ceiling`); one that waits and could fit later is queued instead.

    A fast answer, not the judgement: it is the region level's own check (`quota_refusal`, the arithmetic of
    `scheduler.quota.accounts`), asked before anything exists so that a refusal is a 409 rather than a failed
    allocation. The placement asks it again on fresher usage, and the claim decides, under the tenant's lock
    (`store.claims`)."""
    tenant = body.tenant
    view = snapshot.tenants.get(tenant or "")
    if view is None:
        return  # a tenant the cache does not know yet: placement reads it fresh and decides
    usage = await tenant_usage(session)
    current = snapshot.with_tenants(
        dataclasses.replace(
            other,
            active_gpus=(held := usage.get(other.name, NO_USAGE)).active,
            in_flight_gpus=held.in_flight,
            held=held.held,
        )
        for other in snapshot.tenants.values()
    )
    refusal = quota_refusal(current, body.placement_request(tenant, within_nominal=within_nominal))
    if refusal is None:
        return
    mine = usage.get(view.name, NO_USAGE)
    details = {
        "tenant": view.name,
        "gpu_quota": view.gpu_quota,
        "active_gpus": mine.active,
        "in_flight_gpus": mine.in_flight,
        "requested_gpus": body.gpu_count,
    }
    raise ApiError(409, refusal.code.value, refusal.message, details)


def queue_ceiling(snapshot: Snapshot, tenant: TenantRow, request: PlacementRequest) -> int:
    """The most GPUs the tenant could ever hold of what the request wants (its quotas, plus what an idle cohort
    could lend it): a request that waits and is larger than this is refused at once, since waiting could never
    get it placed."""
    view = snapshot.tenants.get(tenant.name)
    if view is None:
        return tenant.gpu_quota
    return quota.ceiling(view, snapshot.tenants.values(), request.wants_product, snapshot.cohorts)
