"""The fleet as one tenant may use it: the regions its policy admits, their pools and those pools' nodes.

A tenant's explain, its capacity surface and the choices listed in its 422s are computed over this view, so a
tenant learns nothing of regions it may not use (their names, pools, nodes or live free counts), and cannot tell a
node it may not use from one that does not exist. The regions are those the region scheduler would not drop for
tenant policy alone (allowed regions, required jurisdiction), judged by the region scheduler's own filters, so the
view and placement cannot disagree. Admins see the whole snapshot.
"""

from __future__ import annotations

from scheduler.placement.plugins import Filter, first_failure
from scheduler.placement.region import AllowedForTenant, Residency
from scheduler.snapshot import Snapshot
from scheduler.views import RegionView


def usable_regions(snapshot: Snapshot, tenant: str) -> frozenset[str]:
    """The regions `tenant`'s policy lets it use; none for a tenant the snapshot does not know."""
    view = snapshot.tenants.get(tenant)
    if view is None:
        return frozenset()
    required = frozenset({view.required_jurisdiction} if view.required_jurisdiction else ())
    policy: list[Filter[RegionView]] = [AllowedForTenant(view), Residency(required)]
    return frozenset(name for name, region in snapshot.regions.items() if first_failure(region, policy) is None)


def tenant_view(snapshot: Snapshot, tenant: str) -> Snapshot:
    """`snapshot` cut down to what `tenant` may use (`Snapshot.within` its usable regions)."""
    return snapshot.within(usable_regions(snapshot, tenant))
