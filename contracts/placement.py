"""What the scheduler is asked and what it answers: a placement request (region, cluster and node levels), a plan
request (node level), the candidate nodes it chooses and the bundles a plan is made of.

The placement request is the allocation API body plus the knobs the workflow sets itself (nodes to exclude on a
retry, the tie-break seed). The plan request is the narrower intent a node agent receives: the node scheduler must
not know quota, tenant policy or other regions, so it is not given them. The scheduler that answers them is
`scheduler/placement/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from contracts.explanation import Explanation, Refusal
from contracts.pci import normalise_pci
from contracts.vocabulary import PoolShape, SlotState

# A GPU's PCI address as the host's slots name it: `00000000:1B:00.0` (nvidia-smi) is `0000:1b:00.0`.
PciAddress = Annotated[str, AfterValidator(normalise_pci)]


class CapacityShape(StrEnum):
    GPU_SLICE = "gpu_slice"  # a VM built from per-slot bundles on one node
    BAREMETAL = "baremetal"  # a whole host


class NumaPolicy(StrEnum):
    REQUIRED = "required"  # all bundles on one NUMA node, or refuse
    PREFERRED = "preferred"  # one NUMA node when possible, else the fewest NUMA nodes
    NONE = "none"  # lowest slot indices, wherever they are


class Ranking(StrEnum):
    BINPACK = "binpack"  # best fit: fill partly used nodes first so whole nodes stay free for bare metal
    SPREAD = "spread"  # most free bundles first


def same_product(offered: str | None, wanted: str) -> bool:
    """Products compare without regard to case: users type `h200` for `H200`."""
    return offered is not None and offered.casefold() == wanted.casefold()


class PlacementRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    gpu_count: PositiveInt
    gpu_product: str | None = Field(default=None, description="e.g. H200; unset takes any product.")
    shape: CapacityShape = CapacityShape.GPU_SLICE
    region: str | None = Field(default=None, description="The user's region; unset lets the scheduler choose.")
    tenant: str | None = Field(default=None, description="Whose policy and quota apply; unset skips both (operator).")
    required_jurisdiction: str | None = None
    cluster_selector: dict[str, str] = Field(default_factory=dict, description="Cluster matchLabels.")
    selectors: list[str] = Field(
        default_factory=list, description="DRA CEL selectors the pool's GPU device must all satisfy."
    )
    numa_policy: NumaPolicy = NumaPolicy.PREFERRED
    ranking: Ranking = Ranking.BINPACK
    alternates: NonNegativeInt = Field(default=5, description="Candidate nodes returned besides the chosen one.")
    nodes: frozenset[str] = Field(
        default_factory=frozenset,
        description="Pinned nodes: only these may take the request; when none of them can, the request is refused "
        "with `pinned_nodes_unavailable`, never placed elsewhere.",
    )
    gpus: frozenset[PciAddress] = Field(
        default_factory=frozenset,
        description="Pinned GPUs (PCI addresses) on the one pinned node: exactly these slots, or refused with "
        "`pinned_nodes_unavailable` naming each GPU that cannot be had and why.",
    )
    exclude_nodes: frozenset[str] = Field(default_factory=frozenset, description="Nodes already tried in this run.")
    reserved_nodes: frozenset[str] = Field(
        default_factory=frozenset,
        description="Nodes set aside for the request at the head of a queue (scheduler/admission/admit.py): not for this one.",
    )
    seed: int | None = Field(default=None, description="Rotates the order of equally ranked nodes.")
    lease_seconds: float | None = Field(
        default=None, gt=0, description="How long the allocation will be held: only pools granting as long."
    )
    reservation_id: str | None = Field(
        default=None, description="The reservation this allocation is the start of: its own hold is not in its way."
    )
    within_nominal: bool = Field(
        default=False,
        description="Of a `nonPreemptible` PriorityClass: admitted only within its tenant's nominal quota, never on "
        "GPUs borrowed from its cohort, which their owner may reclaim (KAI-Scheduler's non-preemptible workloads).",
    )

    @model_validator(mode="after")
    def _gpus_pin_one_node(self) -> PlacementRequest:
        """A PCI address names a GPU only on its own host, and the GPUs pinned are the allocation's GPUs."""
        if self.gpus:
            check_gpu_pins(self.gpus, self.gpu_count, self.shape)
            if len(self.nodes) != 1:
                raise ValueError("gpus can be pinned only together with exactly one pinned node")
        return self

    def wants_product(self, product: str | None) -> bool:
        return self.gpu_product is None or same_product(product, self.gpu_product)

    def describe(self) -> str:
        """ "2 H200 GPU slices", "8 GPUs as a whole bare-metal host": what a candidate can or cannot take."""
        product = f"{self.gpu_product} " if self.gpu_product else ""
        plural = "s" if self.gpu_count != 1 else ""
        if self.shape is CapacityShape.BAREMETAL:
            return f"{self.gpu_count} {product}GPU{plural} as a whole bare-metal host"
        return f"{self.gpu_count} {product}GPU slice{plural}"


class PlanRequest(BaseModel):
    """What a node agent is asked to plan on its own host."""

    model_config = ConfigDict(frozen=True)

    allocation_id: str | None = Field(
        default=None, description="Slots this allocation already holds count as free: re-planning is idempotent."
    )
    gpu_count: PositiveInt
    shape: CapacityShape = CapacityShape.GPU_SLICE
    numa_policy: NumaPolicy = NumaPolicy.PREFERRED
    gpus: frozenset[PciAddress] = Field(
        default_factory=frozenset, description="Pinned GPUs (PCI addresses): exactly these slots, or a refusal."
    )

    @model_validator(mode="after")
    def _gpus_are_the_request(self) -> PlanRequest:
        if self.gpus:
            check_gpu_pins(self.gpus, self.gpu_count, self.shape)
        return self


def check_gpu_pins(gpus: frozenset[str], gpu_count: int, shape: CapacityShape) -> None:
    """Pinned GPUs are slices of one host, and they are the whole request: no more, no fewer."""
    if shape is not CapacityShape.GPU_SLICE:
        raise ValueError("gpus can be pinned only for gpu_slice: a bare-metal allocation takes the whole host")
    if len(gpus) != gpu_count:
        raise ValueError(f"gpu_count is {gpu_count} but {len(gpus)} distinct GPUs are pinned: they must be equal")


# A slot's stable id, given by whoever builds the scheduler's view (fleet-built snapshots use "<node>/<index>").
SlotId = str | int


class Candidate(BaseModel):
    """A node that can take the request, as the cluster level ranks it."""

    model_config = ConfigDict(frozen=True)

    node: str
    pool: str  # cluster/pool
    cluster: str
    region: str
    free_bundles: int  # compatible free bundles on the node now


class Bundle(BaseModel):
    """One slot as the runtime executor attaches it (docs/seeds.md, "The GPU slice bundle"), plus the slot id to
    claim."""

    model_config = ConfigDict(frozen=True)

    slot_id: SlotId
    slot_index: int
    gpu_pci: str
    fabric_parent_pci: str | None
    fabric_vf_pci: str | None
    nvme_device: str | None
    numa_node: int
    vcpu_count: int
    memory_mib: int
    mac_address: str | None
    private_ip: str | None


# A GPU's state as people read the fleet (scheduler/placement/capacity.py `gpu_states`), the first that applies.
GpuState = Literal["free", "held", "reserved", "leased", "quarantined", "failed", "degraded", "off"]
GPU_STATES: tuple[GpuState, ...] = ("free", "held", "reserved", "leased", "quarantined", "failed", "degraded", "off")


class PoolCapacity(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool: str  # cluster/pool
    cluster: str
    region: str
    shape: PoolShape
    gpu_product: str | None
    nodes: int
    ready_nodes: int  # READY, with a live node agent
    agents_down: int  # nodes whose agent is not live (counted in `nodes`, never in `ready_nodes`)
    cooling_off: int = 0  # ready nodes the breaker leaves out after repeated failed attempts (no slices counted)
    gpus: int  # slots the fleet declares, whatever the hosts say
    validated_gpus: int  # slots whose GPU the node agents validated on the host (raw GPUs that really exist)
    compatible_gpus: int  # slots that are slice bundles: approved, own VF, validated (node-scheduler capacity)
    raw_free_gpus: int  # validated slots no one holds on ready nodes, compatible or not
    degraded_gpus: int = 0  # slots whose GPU its agent judged degraded or could not read: no new work
    failed_gpus: int = 0  # slots whose GPU failed, until repaired
    slices: dict[int, int]  # GPUs per slice -> slice allocations of that size that would fit now
    baremetal_nodes: int  # whole hosts a bare-metal request could take now
    states: dict[GpuState, int] = Field(
        default_factory=dict,
        description="Its GPUs by state, each counted once (the first that applies): failed, quarantined, degraded "
        "(or of unknown health), held (by an allocation), leased (being placed), off (free, on a node that takes no "
        "new work or a GPU that did not validate), reserved (free, promised to a reservation whose window is open), "
        "free. They add up to `gpus`.",
    )


class BundlePlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    node: str
    capacity_shape: CapacityShape
    gpu_count: int
    bundles: list[Bundle]

    @property
    def slot_ids(self) -> list[SlotId]:
        return [bundle.slot_id for bundle in self.bundles]


class HeldSlot(BaseModel):
    """A slot of a node and the allocation that claims or leases it (or whose failure left it quarantined).

    The scheduler's text (refusals, summaries, per-item detail) says only that a slot is claimed, leased or
    quarantined: that text reaches tenants, in explain and in their own allocations' failure reasons, and a tenant
    may not learn another tenant's allocation ids. Who holds what is this structured list instead, which a caller
    shows to whom it may (the API: to admins, next to explain's answer)."""

    model_config = ConfigDict(frozen=True)

    node: str
    slot_id: str  # as the bundle level's per-item detail names the slot
    slot_index: int
    gpu_pci: str
    state: SlotState
    allocation: str


class PlacementResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    placed: bool
    region: str | None
    candidates: list[Candidate]  # chosen node first, then alternates
    plan: BundlePlan | None  # what the chosen node's scheduler would plan, given the snapshot's view of it
    refusal: Refusal | None
    explanation: Explanation
    # Who holds the held slots of the pinned and the chosen nodes. Never set by `schedule`: its text and this result
    # reach tenants, who may not learn others' allocation ids; the API adds it for admins (api/routes/placement.py).
    holders: list[HeldSlot] | None = None
    # A dry run of preemption: what a queued request of this priority would displace to be placed; the
    # API adds it to a refusal for capacity or quota (api/routes/placement.py). None: nothing would be.
    preemption: PreemptionPreview | None = None

    @property
    def chosen(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None


class PreemptionVictim(BaseModel):
    model_config = ConfigDict(frozen=True)

    allocation_id: str | None  # shown to admins and to its own tenant only
    node: str
    gpus: int
    priority: int
    rule: str


class PreemptionPreview(BaseModel):
    """What a preemption would take: `case` quota or capacity, the node it would free (capacity), the victims."""

    model_config = ConfigDict(frozen=True)

    case: str
    node: str | None
    victims: list[PreemptionVictim]


@dataclass(frozen=True)
class PoolAt:
    """A pool's GPUs at one instant: held by running allocations that still hold them then, promised to reservations
    whose window covers it, and free (in all, and the most on one node: the largest request it could take)."""

    pool: str
    region: str
    gpu_product: str | None
    gpus: int
    held: int
    reserved: int
    free: int
    largest_free: int
