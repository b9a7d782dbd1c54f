"""`kind: SlotState`: who holds which slots, for what-if questions asked offline.

A fleet file says what hardware exists; a SlotState document says which slots are taken, so `berth explain -f`
can answer "would this fit if these allocations were running?" without a database:

    apiVersion: berth.dev/v1alpha1
    kind: SlotState
    metadata: {name: tuesday-peak}
    spec:
      allocations:
      - id: alloc-17
        tenant: acme            # optional: counts the GPUs against acme's quota
        state: claimed          # claimed (active) or leased (in flight)
        slots: [j22u05/0, j22u05/1]
      quarantined: [j22u05/7]

Slot ids are `<node>/<slot index>`, as in every snapshot built from a fleet file. A tenant's usage is what these
documents give it: claimed slots count as active GPUs, leased slots as in flight.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from contracts.manifest import Spec
from fleet.meta import ObjectMeta


class SlotHold(Spec):
    id: str = Field(description="Allocation id.")
    tenant: str | None = None
    state: Literal["claimed", "leased"] = "claimed"
    slots: list[str]


class SlotStateSpec(Spec):
    allocations: list[SlotHold] = Field(default_factory=list)
    quarantined: list[str] = Field(default_factory=list)


class SlotStateDocument(Spec):
    api_version: str
    kind: Literal["SlotState"]
    metadata: ObjectMeta
    spec: SlotStateSpec = Field(default_factory=SlotStateSpec)
