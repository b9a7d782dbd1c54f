"""Admission: a request the fleet could never hold is refused before anything exists (seed 003's fast fail).

"Never" means no host of the asked shape and product (in the asked region) has that many GPUs at all, whatever is
claimed, cordoned or down right now: those requests would only start a workflow that fails at its first step, and
under a burst they would queue behind the region's placement lock for an answer already known. What merely does
not fit now still becomes an allocation, which fails with `insufficient_capacity` and its explanation.

    the API's inventory cache -> largest host per (region, product, shape), kept per snapshot -> 422 `unsatisfiable`
"""

from __future__ import annotations

from collections import defaultdict

from api.errors import ApiError
from api.models import AllocationCreate
from scheduler.snapshot import Snapshot

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


def check_admissible(snapshot: Snapshot, body: AllocationCreate) -> None:
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
