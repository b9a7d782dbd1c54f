"""What goes over the wire: request bodies and responses of the HTTP API (docs/design.md section 6), one
definition that the API validates with, the Python client (`berth/`) parses with and the CLI prints from.

Request fields are constrained tightly (names, lengths, no control characters) so that anything that passes
validation can be stored and scheduled; a bad value is a 422 naming the field, never a database error.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializationInfo,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic.functional_serializers import SerializerFunctionWrapHandler
from pydantic_core import PydanticCustomError

from contracts.allocation import ALLOCATION_STATES, USER_DATA_MAX_BYTES, Lease
from contracts.audit import AuditReport
from contracts.deployment import ClusterNote, ReplicaSummary
from contracts.durations import DURATION_FORMS, DURATION_PATTERN, format_duration, typed_duration
from contracts.fleet_apply import ApplyChange
from contracts.manifest import Name
from contracts.placement import (
    Bundle,
    CapacityShape,
    GpuState,
    PciAddress,
    PlacementRequest,
    PoolAt,
    PoolCapacity,
)

AllocationState = Literal[ALLOCATION_STATES]  # type: ignore[valid-type]
AllocationId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Product = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,62}[A-Za-z0-9])?$")]
IdempotencyKey = Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{1,255}$")]
LABEL_KEY = r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^[^\x00-\x1f\x7f]{0,253}$"
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE)]
MAX_LABELS = 64
# Published with `propertyNames` (the rule holds for every key) instead of the `patternProperties` pydantic writes,
# which leaves a key matching no pattern unconstrained: schemathesis sent `{"": ...}` as valid and got a 422.
Labels = Annotated[
    dict[LabelKey, LabelValue],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": LABEL_KEY},
            "additionalProperties": {"type": "string", "pattern": LABEL_VALUE},
            "maxProperties": MAX_LABELS,
        }
    ),
]
PCI_ADDRESS = r"^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"  # scheduler/host/inventory.py


def _unpadded(value: object) -> object:
    """The published pattern admits no surrounding blanks, so neither does the API (normalise_pci strips them)."""
    if isinstance(value, str) and value != value.strip():
        raise ValueError(f"{value!r} is not a PCI address")
    return value


GpuAddress = Annotated[
    PciAddress, BeforeValidator(_unpadded), WithJsonSchema({"type": "string", "pattern": PCI_ADDRESS})
]
Image = Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{1,512}$")]
# A DRA CEL expression as Kubernetes bounds it (resource.CELSelectorExpressionMaxLength); compiled by the routes.
Selector = Annotated[str, StringConstraints(min_length=1, max_length=10240)]
MAX_SELECTORS = 32  # resource.DeviceSelectorsMaxSize
MAX_PINNED_NODES = 64
SshPublicKey = Annotated[
    str,
    StringConstraints(
        max_length=16384, pattern=r"^(ssh|ecdsa|sk)-[A-Za-z0-9@._-]+ [A-Za-z0-9+/]+={0,3}( [^\x00-\x1f\x7f]*)?$"
    ),
]

USER_DATA_HEADER = "#cloud-config"


def _cloud_config_shape(value: str) -> str:
    """What a schema can say of a tenant's cloud-config, checked with the body: its size and its first line, the
    header without which cloud-init does not read the text as cloud-config at all. The text is kept as the tenant
    wrote it (comments included). What it says is `cloud_config_problem`'s to check: parsing 64 KiB of YAML takes
    up to half a second, which the routes spend off the event loop."""
    size = len(value.encode())
    if size > USER_DATA_MAX_BYTES:
        raise PydanticCustomError(
            "user_data_too_large",
            "is {size} bytes; user-data may be at most {limit} bytes (64 KiB)",
            {"size": size, "limit": USER_DATA_MAX_BYTES},
        )
    first, _, _ = value.partition("\n")
    if first.rstrip(" \t\r") != USER_DATA_HEADER:  # as the published pattern has it
        raise PydanticCustomError(
            "user_data_header",
            "must start with the line {header}: cloud-init reads the document as cloud-config only then",
            {"header": USER_DATA_HEADER},
        )
    return value


# Published as what the schema can say: a string of at most 64 KiB whose first line is the header. maxLength
# counts characters and the limit bytes, so a long non-ASCII text may still be refused, `user_data_too_large`.
UserData = Annotated[
    str,
    AfterValidator(_cloud_config_shape),
    WithJsonSchema({"type": "string", "maxLength": USER_DATA_MAX_BYTES, "pattern": r"^#cloud-config[ \t\r]*(\n|$)"}),
]


def _not_true_or_false(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a number")
    return value


# A whole number in a request body: JSON's `true` is not 1 (pydantic's lax mode takes it as 1), while 2.0 is 2, as
# JSON Schema's `integer` says.
Count = Annotated[int, BeforeValidator(_not_true_or_false)]


class Strict(BaseModel):
    """Unknown fields are errors: a misspelt `gpu_prodcut` must not silently schedule any product."""

    model_config = ConfigDict(extra="forbid", frozen=True)


RECORDED = {"recorded": True}  # validation context: a body the API stored, whose durations it wrote as seconds


def _typed_duration(most: float, zero: bool) -> BeforeValidator:
    """A duration in a request body: a string with its unit (`contracts.durations.typed_duration`), never a bare number,
    which a person may have meant in hours as well as in seconds. A body the API recorded is read back with the
    `RECORDED` context, its durations then being the seconds it stored. The bounds are checked here, as their own
    problem type: no JSON Schema pattern can bound the sum of a duration's parts."""

    def parse(value: object, info: ValidationInfo) -> float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and (info.context or {}).get("recorded"):
            return float(value)  # type: ignore[arg-type]
        if not isinstance(value, str):
            said = json.dumps(value)
            message = (
                f'{said} has no unit: write "{said}s", "{said}m" or "{said}h"'
                if number
                else (f"{said} is not a duration")
            )
            raise PydanticCustomError(
                "duration_type",
                "{message} (a duration is a string: {forms})",
                {"message": message, "forms": DURATION_FORMS},
            )
        try:
            seconds = typed_duration(value)
        except ValueError as error:
            raise PydanticCustomError("duration_format", "{message}", {"message": str(error)}) from None
        if (seconds == 0 and not zero) or seconds > most:
            bounds = f"{'0 or more' if zero else 'more than 0'} and at most {format_duration(most)}"
            raise PydanticCustomError(
                "duration_out_of_range", "{text} is out of range: {bounds}", {"text": repr(value), "bounds": bounds}
            )
        return seconds

    return BeforeValidator(parse)


# Published as the strings it takes: what the schema calls well formed is exactly what `typed_duration` parses.
DURATION_SCHEMA = WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN})
# A wait as long as a tenant could ever be allowed (a year); 0 never waits.
QueueTimeout = Annotated[float, _typed_duration(365 * 24 * 3600, zero=True), DURATION_SCHEMA]
# A lease: more than nothing, at most ten years.
LeaseDuration = Annotated[float, _typed_duration(10 * 365 * 24 * 3600, zero=False), DURATION_SCHEMA]


class QueueRequest(Strict):
    """How long the request may wait in its region's queue, as Go and Kubernetes write durations."""

    timeout: QueueTimeout = Field(description="`30m`, `2h`, `90s` (a unit is required); `0` never waits.")


def given(field: str) -> dict[str, object]:
    """JSON Schema for "`field` is present and not null", so that a schema saying "one of two ends" counts an
    explicit null as absent, as the models' validators do."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}}}


class AllocationCreate(Strict):
    """The allocation request (`POST /v1/allocations` and `POST /v1/explain`)."""

    model_config = ConfigDict(json_schema_extra={"not": {"allOf": [given("duration"), given("ends_at")]}})

    gpu_count: Count = Field(ge=1, le=1024, description="GPUs wanted.")
    gpu_product: Product | None = Field(default=None, description="e.g. H200; unset takes any product.")
    shape: CapacityShape = Field(
        default=CapacityShape.GPU_SLICE, description="`gpu_slice` (a VM from per-GPU bundles) or `baremetal`."
    )
    region: Name | None = Field(default=None, description="Unset lets the region scheduler choose.")
    image: Image | None = None
    ssh_public_keys: list[SshPublicKey] = Field(default_factory=list, max_length=32)
    user_data: UserData | None = Field(
        default=None,
        description="A cloud-init `#cloud-config` document for the VM, as text: its first line `#cloud-config`, at "
        "most 64 KiB, a YAML mapping. Merged into the user-data of the VM's NoCloud seed, so it may not set the keys "
        "the seed sets itself: `hostname` and `fqdn` (Berth names the VM), `ssh_authorized_keys` (the keys are "
        "`ssh_public_keys`), `ssh_pwauth` and `disable_root` (key logins only, no root), `users` (a users list "
        "replaces the default user, which carries the SSH keys). Stored with the request and in the workflow's "
        "history: put no secrets in it. A bad document is a 422 `invalid_request` naming `body.user_data`.",
    )
    labels: Labels = Field(default_factory=dict, max_length=MAX_LABELS)
    tenant: Name | None = Field(
        default=None, description="Whose allocation this is. Required with an admin token; a tenant token's own."
    )
    selectors: list[Selector] = Field(
        default_factory=list,
        max_length=MAX_SELECTORS,
        description='DRA CEL selectors the GPU device must all satisfy, e.g. `device.capacity["gpu.nvidia.com"]'
        '.memory.compareTo(quantity("141Gi")) >= 0`; one that does not compile is a 422 naming it and the position.',
    )
    cluster_selector: Labels = Field(
        default_factory=dict, max_length=MAX_LABELS, description="Cluster labels that must all match (matchLabels)."
    )
    nodes: list[Name] = Field(
        default_factory=list,
        max_length=MAX_PINNED_NODES,
        description="Pinned nodes: only these may take the allocation; refused, never placed elsewhere, when none can.",
    )
    gpus: list[GpuAddress] = Field(
        default_factory=list,
        max_length=1024,
        description="Pinned GPUs (PCI addresses, e.g. `0000:1b:00.0`) of the one pinned node's approved slots: exactly "
        "these, as many as `gpu_count`; refused with the reason, never placed elsewhere, when any is not free.",
    )

    queue: QueueRequest | None = Field(
        default=None,
        description="Wait for capacity instead of failing when no node can take the request now: `{timeout: 30m}`. "
        "Unset: the tenant's `queue.defaultTimeout` applies (no waiting when it has none); `timeout: 0` never waits.",
    )
    priority_class: Name | None = Field(
        default=None,
        description="A PriorityClass of the fleet (one the tenant may use): a waiting request of a higher class is "
        "placed first. Unset: the fleet's default class, or priority 0.",
    )
    duration: LeaseDuration | None = Field(
        default=None,
        description="How long it is held once active (`48h`, `90m`: a unit is required); at its end it is released, "
        "ends "
        "`expired`. Only pools whose `maxLease` is as long take it. Unset (and no `ends_at`): no end, unless its pool "
        "has a `maxLease`, which then is its end.",
    )
    ends_at: AwareDatetime | None = Field(
        default=None, description="When it ends (RFC 3339, with an offset); the alternative to `duration`."
    )

    @model_validator(mode="after")
    def _one_end(self) -> AllocationCreate:
        if self.duration is not None and self.ends_at is not None:
            raise ValueError("give duration or ends_at, not both")
        return self

    @model_serializer(mode="wrap")
    def _recorded(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, object]:
        """Leave the newer fields out while unset, so a body recorded before they existed keeps its fingerprint
        (an Idempotency-Key retried across an upgrade is still the same request)."""
        data: dict[str, object] = handler(self)
        for name in _NEWER_FIELDS:
            if name in data and not data[name]:
                del data[name]
        return data

    def lease(self) -> Lease | None:
        if self.duration is not None:
            return Lease(duration_seconds=self.duration)
        return Lease(ends_at=self.ends_at) if self.ends_at is not None else None

    def lease_seconds(self) -> float | None:
        """How long it would be held if it became active now: what a pool's `maxLease` is compared with."""
        if self.ends_at is not None:
            return max((self.ends_at - datetime.now(UTC)).total_seconds(), 0.001)
        return self.duration

    def placement_request(
        self, tenant: str | None, exclude_nodes: frozenset[str] = frozenset(), within_nominal: bool = False
    ) -> PlacementRequest:
        """What the scheduler places for this body: the one place a create body becomes a PlacementRequest (a
        reservation's body goes through here too). `within_nominal`: its PriorityClass is non-preemptible (the route
        looks the class up)."""
        return PlacementRequest(
            gpu_count=self.gpu_count,
            gpu_product=self.gpu_product,
            shape=self.shape,
            region=self.region,
            tenant=tenant,
            selectors=self.selectors,
            cluster_selector=self.cluster_selector,
            nodes=frozenset(self.nodes),
            gpus=frozenset(self.gpus),
            exclude_nodes=exclude_nodes,
            lease_seconds=self.lease_seconds(),
            within_nominal=within_nominal,
        )


_NEWER_FIELDS = (
    "selectors",
    "cluster_selector",
    "nodes",
    "gpus",
    "queue",
    "priority_class",
    "duration",
    "ends_at",
    "user_data",
)


class AllocationAccepted(BaseModel):
    """The answer to every action on an allocation: which one, its state now, and its workflow."""

    id: str
    state: str
    workflow_id: str


class AllocationEnd(BaseModel):
    """An allocation's end after an extension."""

    id: str
    state: str
    ends_at: datetime | None


class ExtendBody(Strict):
    """Move an active allocation's end later: `by` a duration from its current end, or `until` a time."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [given("by"), given("until")]})

    by: LeaseDuration | None = Field(
        default=None, description="`2h`, `30m` (a unit is required), added to the current end."
    )
    until: AwareDatetime | None = Field(default=None, description="The new end (RFC 3339, with an offset).")

    @model_validator(mode="after")
    def _one(self) -> ExtendBody:
        if (self.by is None) == (self.until is None):
            raise ValueError("give exactly one of by and until")
        return self


class RetryBody(Strict):
    exclude_nodes: list[Name] = Field(default_factory=list, max_length=64, description="Nodes not to try again.")


class AttemptView(BaseModel):
    """One try on one node. `outcome`: running, succeeded, failed, abandoned (an operator's retry) or cancelled."""

    number: int
    node: str | None
    outcome: str
    reason: str | None


class EventView(BaseModel):
    at: datetime
    state: str
    step: str
    attempt: int | None
    node: str | None
    reason: str | None
    actor: str | None = Field(
        default=None, description="Who asked for this step (a person or a service account); null: Berth's own."
    )


class AllocationSummary(BaseModel):
    id: str
    tenant: str
    state: str
    shape: str
    gpu_count: int
    gpu_product: str | None
    region: str | None
    pool: str | None  # cluster/pool
    node: str | None
    failure_reason: str | None
    borrowed_gpus: int = Field(
        default=0, description="GPUs it holds beyond its tenant's gpuQuota, lent by the tenant's cohort (reclaimable)."
    )
    ends_at: datetime | None = Field(default=None, description="When its lease ends (then `expired`); null: no end.")
    workflow_id: str
    created_at: datetime
    updated_at: datetime


class AllocationDetail(AllocationSummary):
    requested_by: str | None = Field(default=None, description="Who asked for it: a person or a service account.")
    step: str | None = Field(description="The workflow's current step, when its live status was read.")
    live: bool = Field(description="Whether the running workflow answered a status query for this read.")
    bundles: list[Bundle]
    attempts: list[AttemptView] = Field(description="Every attempt of every run, oldest first.")
    events: list[EventView]
    queue: QueuePlace | None = Field(
        default=None, description="Its place in its region's queue while it waits for capacity; null otherwise."
    )


class AllocationList(BaseModel):
    allocations: list[AllocationSummary]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; null on the last page."
    )


class CapacityReport(BaseModel):
    pools: list[PoolCapacity]


class FleetCounts(BaseModel):
    """What the fleet file declares (NodeLists adopted), as `berth apply --dry-run` counts it."""

    regions: int
    tenants: int
    classes: int
    clusters: int
    nodes: int = Field(description="Every node of every pool.")


class SkippedNode(BaseModel):
    """A node of a NodeList that became no pool's: what it lacks, never guessed."""

    name: str
    reason: str


class FleetApplied(BaseModel):
    summary: str = Field(description="What changed, in one line; with `dry_run`, what the file declares.")
    dry_run: bool = Field(default=False, description="True: the file was only validated; nothing was written.")
    counts: FleetCounts
    changes: list[ApplyChange]
    unchanged: int
    skipped: list[SkippedNode] = Field(
        default_factory=list, description="Nodes of the NodeLists that no pool took, each with the reason."
    )
    tenant_tokens: dict[str, str] = Field(
        description="Tokens created now for tenants that had none; shown once, store them."
    )
    deployments_told: int | None = Field(
        default=0,
        description="Running ModelDeployments told to re-plan now; null when Temporal could not be told (they re-plan "
        "at their next resync).",
    )


# Lifetimes of tokens are also counted in whole days (`90d`), beside every typed duration.
LIFETIME_DAYS = r"^[0-9]+d$"
LIFETIME_PATTERN = f"({LIFETIME_DAYS})|({DURATION_PATTERN})"
LIFETIME_MOST = 10 * 365 * 86400.0


def lifetime_seconds(text: str) -> float:
    """A token's lifetime in seconds: whole days (`90d`) or a typed duration (`12h`, `1h30m`); ValueError else."""
    if re.fullmatch(LIFETIME_DAYS, text):
        return int(text[:-1]) * 86400.0
    try:
        return typed_duration(text)
    except ValueError as error:
        raise ValueError(f"{error}; or whole days, as in 90d") from None


def _lifetime(value: object) -> float:
    if not isinstance(value, str):
        raise PydanticCustomError("duration_type", "a lifetime is a string: 90d, 12h, 1h30m")
    try:
        seconds = lifetime_seconds(value)
    except ValueError as error:
        raise PydanticCustomError("duration_format", "{message}", {"message": str(error)}) from None
    if not 0 < seconds <= LIFETIME_MOST:
        raise PydanticCustomError(
            "duration_out_of_range",
            "{text} is out of range: a token's lifetime is more than 0 and at most 3650d",
            {"text": repr(value)},
        )
    return seconds


TokenLifetime = Annotated[
    float, BeforeValidator(_lifetime), WithJsonSchema({"type": "string", "pattern": LIFETIME_PATTERN})
]
TokenRole = Literal["viewer", "member", "operator", "admin", "node"]
TOKEN_LABEL = r"^[^\x00-\x1f\x7f]{0,200}$"


def _scope(message: str) -> PydanticCustomError:
    """A role and scope that do not go together: a rule between fields, its own problem type (`token_scope`)."""
    return PydanticCustomError("token_scope", "{message}", {"message": message})


class TokenCreate(Strict):
    """`POST /v1/tokens`: a service account's token (a role; a tenant for viewer and member) or a node agent's."""

    role: TokenRole | None = Field(
        default=None,
        description="viewer or member (with `tenant`; member when unset), operator or admin (no tenant: they hold "
        "every tenant), node (with `node`; the default there).",
    )
    tenant: Name | None = Field(default=None, description="The tenant of a viewer's or member's token.")
    node: Name | None = Field(default=None, description="A node agent's token: it reports for this node only.")
    label: Annotated[str, StringConstraints(pattern=TOKEN_LABEL)] | None = Field(
        default=None, description="A note on who holds it."
    )
    expires_in: TokenLifetime | None = Field(
        default=None, description="It stops working after this long: `90d`, `12h`, `1h30m`; unset: never."
    )

    @model_validator(mode="after")
    def _one_scope(self) -> TokenCreate:
        if sum((self.role in ("operator", "admin"), self.tenant is not None, self.node is not None)) != 1:
            raise _scope("give exactly one of tenant (viewer or member), role operator|admin, or node")
        if self.tenant is not None and self.role not in (None, "viewer", "member"):
            raise _scope(f"a tenant's token is a viewer or a member, not {self.role}")
        if self.node is not None and self.role not in (None, "node"):
            raise _scope(f"a node's token has the role node, not {self.role}")
        return self

    def chosen_role(self) -> TokenRole:
        """The role given, else what the scope implies: node for a node, member for a tenant."""
        if self.role is not None:
            return self.role
        return "node" if self.node is not None else "member"


class TokenCreated(BaseModel):
    id: int
    role: TokenRole
    tenant: str | None
    node: str | None
    label: str | None
    expires_at: datetime | None
    token: str = Field(description="The bearer itself: shown this once, only its digest is kept.")


class TokenView(BaseModel):
    id: int
    role: TokenRole
    tenant: str | None
    node: str | None
    label: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenList(BaseModel):
    tokens: list[TokenView] = Field(description="Oldest first; never a plaintext.")


class TokensRevoked(BaseModel):
    revoked: list[int] = Field(description="The ids revoked now, ascending; refused everywhere within seconds.")


# Long polls (`wait_for` on a GET): how long one request may wait for a state.
WAIT_MOST_SECONDS = 60.0
WAIT_DEFAULT_SECONDS = 30.0
WaitTimeout = Annotated[float, _typed_duration(WAIT_MOST_SECONDS, zero=True), DURATION_SCHEMA]


class AgentState(BaseModel):
    state: Literal["live", "down", "never_reported"]
    seen_at: datetime | None = None
    down_reason: str | None = None
    version: str | None = None
    topology: str | None = Field(default=None, description="The hash of the host inventory it last reported.")
    slices_blocked: str | None = Field(default=None, description="Why no slot of the node may be sliced, if so.")
    vm_runtime: str | None = Field(
        default=None,
        description="How its agent runs VMs, as it last reported: the hypervisor, KVM or TCG (and why), and whether "
        "GPUs are passed through.",
    )


class SlotValidation(BaseModel):
    index: int
    gpu_pci: str
    approved: bool
    validation: str = Field(description="valid, raw_only (a raw GPU, no slice), invalid or unvalidated.")
    reason: str | None = None
    message: str | None = None
    validated_at: datetime | None = None


class UnhealthySlot(BaseModel):
    """A slot whose GPU its agent judged not healthy: it takes no new work until repaired."""

    index: int
    gpu_pci: str
    health: str = Field(description="unknown, degraded (what runs keeps running) or failed (its holder was told).")
    reasons: list[str] = Field(default_factory=list, description="Most severe first, in the agent's words.")
    since: datetime | None = None


class SlotSignalsView(BaseModel):
    """A slot's health signals as its agent last reported them: one line per device or source."""

    index: int
    health: str
    signals: dict[str, str] = Field(
        description="`gpu`, `fabric`, `nvme`: presence, driver, AER counts, link; `nvme smart`; `guest` and `nvml`: "
        "what the guest's or the host's NVIDIA driver says; `xids`; `wipe`: a failed reset."
    )
    reported_at: datetime | None = None


class RepairBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slots: list[Annotated[int, Field(ge=0, le=1023), BeforeValidator(_not_true_or_false)]] = Field(
        min_length=1, max_length=1024, description="The slot indexes repaired."
    )


class RepairedSlot(BaseModel):
    index: int
    was: str = Field(description="Its health before the repair.")
    reason: str | None = None


class RepairResult(BaseModel):
    node: str
    repaired: list[RepairedSlot]


class QuarantinedSlot(BaseModel):
    index: int
    reason: str | None = Field(default=None, description="Why: a wipe not confirmed, and what failed.")


class NodeState(StrEnum):
    """What a node is doing: its `status` in `/v1/nodes`, and what `?status=` filters on."""

    READY = "READY"  # takes new allocations: READY in the fleet, not cordoned or drained, its agent live
    NOT_READY = "NOT_READY"  # READY in the fleet, but its agent is not live (never reported, or stopped reporting)
    CORDONED = "CORDONED"  # an operator stopped new placements; what it holds stays
    DRAINING = "DRAINING"  # drained: nothing new, and each allocation's owner was told to move (until uncordoned)
    DOWN = "DOWN"  # declared so in the fleet file


class NodeInfo(BaseModel):
    name: str
    cluster: str
    pool: str  # cluster/pool
    region: str | None
    shape: str
    gpu_product: str | None
    status: NodeState = Field(
        description="What the node is doing: READY (takes work), NOT_READY (no live agent), CORDONED, DRAINING or DOWN."
    )
    declared_status: str = Field(
        description="The status the fleet file gives; `status` differs while cordoned, drained or without a live agent."
    )
    gpus: int
    available_slots: int
    reserved_slots: int
    quarantined_slots: int
    labels: dict[str, str]
    agent: AgentState
    validated_gpus: int = Field(description="Slots whose GPU the agent validated on the host (raw GPUs).")
    compatible_gpus: int = Field(description="Slots that validated as whole slice bundles.")
    invalid_slots: list[SlotValidation] = Field(
        default_factory=list, description="Every slot that is not `valid`, with the agent's reason."
    )
    quarantined: list[QuarantinedSlot] = Field(
        default_factory=list, description="Slots held back until a wipe is confirmed, with the reason."
    )
    signals: list[SlotSignalsView] = Field(
        default_factory=list,
        description="Every slot's health signals with their last reported values (`GET /v1/nodes/{node}` only).",
    )
    unhealthy: list[UnhealthySlot] = Field(
        default_factory=list, description="Slots whose GPU is not healthy, until `berth nodes repair`."
    )
    slots: list[GpuSlot] = Field(
        default_factory=list, description="Every GPU of the node with its state now, by slot index."
    )
    allocations: int = Field(default=0, description="How many allocations hold GPUs of the node now.")


class GpuSlot(BaseModel):
    """One GPU of a node and its state now, as `GET /v1/capacity` counts it per pool."""

    index: int
    gpu_pci: str
    state: GpuState = Field(
        description="The first that applies: failed, quarantined, degraded (or of unknown health), held (by an "
        "allocation), leased (being placed), off (free, but its node takes no new work or its GPU did not validate), "
        "reserved (promised to a reservation whose window is open), free."
    )
    in_use: bool = Field(description="An allocation holds it or is being placed on it.")
    allocation: str | None = Field(
        default=None,
        description="The allocation holding it, for an operator and for that allocation's own tenant; null for "
        "another tenant's (only `in_use`), as explain shows holders.",
    )


class DrainResult(BaseModel):
    node: NodeInfo
    told: list[str] = Field(description="The allocations on it whose owners were told.")
    not_told: list[str] = Field(default_factory=list, description="Those whose workflow could not be reached now.")


class NodeList(BaseModel):
    nodes: list[NodeInfo]
    next_cursor: str | None = Field(default=None, description="Pass as `cursor` for the next page; null on the last.")


class Health(BaseModel):
    status: Literal["ok", "degraded", "unavailable"]
    database: Literal["ok", "unreachable"]
    temporal: Literal["ok", "unreachable"]
    control_workers: int = Field(description="Control workers polling the control task queue recently.")


class QueuePlace(BaseModel):
    """A waiting request's place in its region's queue, and why it is not placed yet."""

    position: int = Field(description="1-based, in admission order, counting every tenant's requests in the region.")
    region: str
    priority: int
    priority_class: str | None
    waited_seconds: float = Field(description="Since it entered the queue (its place is kept when it is woken).")
    enqueued_at: datetime
    deadline_at: datetime = Field(description="It fails `queue_timeout` if it is still waiting then.")
    reason: str | None = Field(description="Why the last admission pass did not place it; null before any pass.")
    code: str | None = Field(description="The reason's code: `insufficient_capacity`, `quota_exceeded`, ...")
    node: str | None = Field(description="The node the last pass set aside for it: it is being placed there.")
    reserved_node: str | None = Field(
        description="The node held for it as the head of the queue: nothing behind it may be placed there."
    )
    status: str = Field(description="All of the above in one line, as `berth queue` shows it.")


class QueueHint(BaseModel):
    """What would let a waiting request through, as far as the API knows it now: one event, not a promise."""

    kind: Literal["release", "reclaim", "reservation_end", "node_return", "quota", "nothing_known"] = Field(
        description="`release`: an allocation on a node it could use ends its lease; `reclaim`: GPUs borrowed "
        "beyond another tenant's quota there; `reservation_end`: a reservation's window there ends; `node_return`: "
        "a node it could use is away (cordoned, draining, down, its agent silent); `quota`: one of its own "
        "tenant's allocations ends and gives quota back; `nothing_known`: none of these."
    )
    text: str = Field(description="The event in one line, as the console shows it.")
    at: datetime | None = Field(default=None, description="When it happens, where that is known (a lease's end).")


class QueueItem(QueuePlace):
    """One request of `GET /v1/queues`."""

    allocation_id: str
    tenant: str
    gpu_count: int
    gpu_product: str | None
    shape: str
    share: float | None = Field(
        description="Its tenant's fair-sharing share (Kueue's dominant resource share): the GPUs it uses beyond its "
        "quota over what its cohort tree could lend it, over its weight; 0 when it borrows nothing, null for a "
        "tenant of weight 0 that borrows (always last). It orders the queue only where the tenant's cohort tree "
        "has fairSharing enabled."
    )
    decayed_gpu_hours: float | None = Field(
        default=None,
        description="Where its tenant's cohort tree sets fairSharing.usageHalfLife: its tenant's GPU-hours decayed "
        "with that half-life (what it used lately; a half-life ago counts half), which ordered it among its tree's "
        "tenants (over the tenant's weight, lowest first). Null elsewhere.",
    )
    unblock: list[QueueHint] = Field(
        default_factory=list,
        description="What would let it through, soonest first, from what the API knows (leases' ends, borrowed "
        "GPUs, reservations' ends, nodes away); empty while it is being placed.",
    )


class RegionQueue(BaseModel):
    region: str
    strategy: str | None = Field(description="StrictFIFO or BestEffortFIFO; null for a region no longer in the fleet.")
    length: int = Field(description="Requests waiting in the region, every tenant's.")
    entries: list[QueueItem] = Field(description="In admission order; a tenant token is shown its own only.")


class QueueList(BaseModel):
    regions: list[RegionQueue]


class UsageGroup(BaseModel):
    """One group's (and bucket's) usage in the window (store/usage.py says what starts and ends a billed interval)."""

    tenant: str | None = Field(default=None, description="A ModelDeployment's replicas: `namespace:<namespace>`.")
    product: str | None = None
    region: str | None = None
    pool: str | None = Field(default=None, description="`<cluster>/<pool>`.")
    priority_class: str | None = Field(default=None, alias="class", serialization_alias="class")
    shape: str | None = None
    bucket: datetime | None = Field(default=None, description="The hour or day this row covers (with `bucket`).")
    gpu_hours: float = Field(description="GPU-hours allocations held in the window, exact to the second.")
    node_hours: float = Field(description="Node-hours ModelDeployment replicas charged (their pools' nodes).")
    reserved_gpu_hours: float = Field(
        description="GPU-hours of reservations' windows in it: held for the tenant, used or not (billed apart)."
    )
    allocations: int = Field(description="Allocations (and replica engines) that began holding capacity in it.")
    peak_gpus: int = Field(description="The most GPUs held at once.")
    share_of_fleet: float | None = Field(
        description="gpu_hours over the fleet's GPUs (as they are now) times the window's hours; null without GPUs."
    )

    model_config = {"populate_by_name": True}


class TenantStanding(BaseModel):
    """A tenant's standing in fair sharing now: what the admission pass orders its tree's requests by."""

    tenant: str
    cohort: str | None = Field(description="Its cohort; null: it shares with no one.")
    weight: float = Field(description="Its fair-sharing weight (0: always last).")
    fair_sharing: bool = Field(description="Whether its cohort tree orders its queue by fair sharing.")
    share: float | None = Field(
        description="Its fair-sharing share now (as `GET /v1/queues` gives it); null: weight 0 and borrowing."
    )
    decayed_gpu_hours: float | None = Field(
        description="Its GPU-hours decayed with its tree's usageHalfLife (null where the tree sets none)."
    )
    usage_half_life_hours: float | None = Field(description="Its tree's usageHalfLife, in hours.")


class UsageReport(BaseModel):
    start: datetime = Field(alias="from", serialization_alias="from")
    end: datetime = Field(alias="to", serialization_alias="to", description="At most now.")
    by: list[str]
    bucket: str | None
    fleet_gpus: int = Field(description="The fleet's GPUs now (every region the caller may use).")
    rolled_up_before: datetime | None = Field(
        description="Usage before this instant is kept per hour (the retention): a window reaching before it "
        "counts whole hours there, and its peak is an upper bound."
    )
    rows: list[UsageGroup]
    fair_shares: list[TenantStanding] = Field(
        default_factory=list,
        description="Each tenant's standing in fair sharing now (the tenants the report covers), whatever the window.",
    )

    model_config = {"populate_by_name": True}


# Deployments (the request body is the ModelDeployment manifest itself).


class DeploymentAccepted(BaseModel):
    name: str
    created: bool = Field(description="True when this PUT created the deployment, false when it updated the spec.")
    workflow_id: str


class DeploymentView(BaseModel):
    """A deployment's status: desired vs available, where each replica runs, and why there are not more."""

    name: str
    namespace: str
    state: str = Field(description="pending, reconciling, steady, deleting or deleted.")
    desired: int
    min_replicas: int | None
    scheduled: int = Field(description="Replicas the last plan found a place for.")
    available: int = Field(description="Replicas whose workload is ready.")
    phase: str | None = Field(description="FullyScheduled, PartiallyScheduled or ScheduleFailed (the last plan).")
    reason: str | None
    message: str = Field(description="The explanation, e.g. `2 of 3 replicas scheduled (checked 2 clusters)`.")
    clusters: list[ClusterNote] = Field(description="Per cluster that took no more replicas: reason and message.")
    replicas: list[ReplicaSummary]
    recent_failures: list[str]
    recent_removals: list[str] = Field(
        default_factory=list,
        description="`<replica>: <reason>: <why>` of replicas the deployment removed lately, e.g. moved off a node "
        "tainted NoExecute (`UntoleratedNoExecuteTaint`).",
    )
    workflow_id: str
    live: bool = Field(description="Whether the running workflow answered; false: the last status it recorded.")


class DeploymentSummary(BaseModel):
    namespace: str
    name: str
    state: str | None
    desired: int
    available: int
    phase: str | None
    message: str


class DeploymentList(BaseModel):
    deployments: list[DeploymentSummary]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; null on the last page."
    )


class WhoAmI(BaseModel):
    actor: str = Field(description="How the audit trail names the caller.")
    kind: Literal["token", "person"]
    role: str = Field(description="The highest role held: viewer, member, operator or admin.")
    tenants: dict[str, str] = Field(
        description="tenant -> role; empty for an operator or admin, who hold every tenant."
    )
    all_tenants: bool = Field(description="Whether the caller holds every tenant (an operator or admin).")
    groups: list[str] = Field(description="A person's groups, as the identity provider said.")
    token_id: int | None = None
    expires_at: datetime | None = None


class OidcLogin(BaseModel):
    issuer: str
    client_id: str
    scopes: list[str]


class AuthConfig(BaseModel):
    oidc: OidcLogin | None = Field(description="Where people log in; null: this API takes Berth tokens only.")


class AuditRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repair: bool = Field(default=False, description="Also fix what is safe to fix (each fix is recorded).")


class AuditView(BaseModel):
    """The latest audit: when it ran, what it found (by kind, with first_seen), what it repaired."""

    ran: bool = Field(description="False until some audit has finished.")
    counts: dict[str, int] = Field(default_factory=dict, description="Findings by kind.")
    report: AuditReport | None = None


class RequestRecord(BaseModel):
    at: datetime
    actor: str
    role: str
    method: str
    route: str
    path: str
    status: int


class RequestRecords(BaseModel):
    requests: list[RequestRecord] = Field(description="Newest first.")


class CapacityAt(BaseModel):
    at: datetime
    pools: list[PoolAt]


class ReservationCreate(Strict):
    """GPUs of one node for `[starts_at, ends_at)` (or `duration` from `starts_at`)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [given("ends_at"), given("duration")]})

    gpu_count: Count = Field(ge=1, le=1024)
    gpu_product: Product | None = None
    shape: CapacityShape = CapacityShape.GPU_SLICE
    region: Name
    pool: str | None = Field(
        default=None,
        max_length=507,
        pattern=r"^[a-z0-9][a-z0-9.-]*/[a-z0-9][a-z0-9.-]*$",
        description="One pool of the region (`cluster/pool`, as `berth capacity` names it); unset: any that serves it.",
    )
    starts_at: AwareDatetime = Field(description="RFC 3339 with an offset; in the future.")
    ends_at: AwareDatetime | None = Field(default=None, description="After starts_at.")
    duration: LeaseDuration | None = Field(
        default=None, description="`48h`, `90m` (a unit is required): the alternative."
    )
    tenant: Name | None = Field(default=None, description="Required with an admin token; a tenant token's own.")

    @model_validator(mode="after")
    def _one_end(self) -> ReservationCreate:
        if (self.ends_at is None) == (self.duration is None):
            raise ValueError("give exactly one of ends_at and duration")
        return self

    def end(self) -> datetime:
        return self.ends_at if self.ends_at is not None else self.starts_at + timedelta(seconds=self.duration or 0)

    def placement_request(self, tenant: str) -> PlacementRequest:
        """The GPUs to place, as the allocation the reservation becomes at its start asks for them: through
        `AllocationCreate.placement_request`, so a create body becomes a PlacementRequest in one place only."""
        allocation = AllocationCreate(
            gpu_count=self.gpu_count, gpu_product=self.gpu_product, shape=self.shape, region=self.region
        )
        return allocation.placement_request(tenant)


class ReservationView(BaseModel):
    id: str
    tenant: str
    state: str  # reserved, started, ended, cancelled, failed
    region: str
    node: str
    gpu_count: int
    gpu_product: str | None
    starts_at: datetime
    ends_at: datetime
    allocation_id: str | None = Field(description="The allocation it became at its start.")
    reason: str | None
    workflow_id: str
    pools: list[str] = Field(
        default_factory=list,
        description="`<cluster>/<pool>` of each pool its node is in now (given by the list; empty elsewhere).",
    )


class ReservationList(BaseModel):
    reservations: list[ReservationView]
