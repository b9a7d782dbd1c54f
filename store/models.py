"""The PostgreSQL schema: inventory, claims and the audit trail.

PostgreSQL is the durable source of truth for what exists and who holds it; Temporal is the source of truth for
what is in flight. The invariants that must never break (one active claim per slot, unique slot identities on a
host) are enforced here by the database, so no bug elsewhere can double-allocate a GPU.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from contracts.allocation import ALLOCATION_STATES, RESERVATION_STATES
from contracts.vocabulary import DEFAULT_FAIR_SHARING_STRATEGIES, CohortQuotaMode, FairSharingStrategy

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

REGION_STATUSES = ("available", "degraded", "unavailable")
POOL_SHAPES = ("gpu_slice", "baremetal", "kubernetes")
NODE_STATUSES = ("READY", "CORDONED", "DRAINING", "DOWN")
FABRIC_MODES = ("per_slot_vf", "shared_parent", "none")
SLOT_STATES = ("available", "reserved", "quarantined")
VALIDATION_STATES = ("valid", "raw_only", "invalid", "unvalidated")
HEALTH_STATES = ("healthy", "unknown", "degraded", "failed")  # scheduler.host.health.HealthState
AGENT_STATES = ("live", "down")
TOKEN_ROLES = ("viewer", "member", "operator", "admin", "node")  # store/tokens.py says what each may do
QUEUEING_STRATEGIES = ("StrictFIFO", "BestEffortFIFO")
COHORT_QUOTA_MODES = tuple(m.value for m in CohortQuotaMode)  # a Cohort's quotaMode
FAIR_SHARING_STRATEGIES = [s.value for s in FairSharingStrategy]  # what preemptionStrategies may name


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class RegionRow(Base):
    __tablename__ = "regions"
    __table_args__ = (
        CheckConstraint(_one_of("status", REGION_STATUSES), name="status"),
        CheckConstraint(_one_of("queueing_strategy", QUEUEING_STRATEGIES), name="queueing_strategy"),
    )

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    jurisdiction: Mapped[str | None] = mapped_column(String(64))
    prices: Mapped[dict[str, float]] = mapped_column(JSONB, nullable=False, default=dict)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, nullable=False, default=dict)
    # How the region's queue of waiting requests is walked (migration 0010).
    queueing_strategy: Mapped[str] = mapped_column(String(16), nullable=False, server_default="BestEffortFIFO")


class PriorityClassRow(Base):
    """A fleet file's PriorityClass (migration 0010): the integer a queued request of that class is ordered by."""

    __tablename__ = "priority_classes"
    __table_args__ = (
        Index("uq_priority_classes_default", "is_default", unique=True, postgresql_where=text("is_default")),
    )

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    value: Mapped[int] = mapped_column(Integer, nullable=False)
    is_default: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    description: Mapped[str | None] = mapped_column(Text)
    # Preemption (migration 0014): spot, anyone may displace it; the notice before its release.
    preemptible: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    grace_seconds: Mapped[float] = mapped_column(Float, nullable=False, server_default="30")
    # Migration 0019: `preemptionPolicy: Never` (displaces nobody) and `nonPreemptible` (never displaced, admitted
    # only within its tenant's nominal quota).
    never_preempts: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    non_preemptible: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")


class InferenceClassRow(Base):
    __tablename__ = "inference_classes"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    api_version: Mapped[str] = mapped_column(String(64), nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)


class ClusterRow(Base):
    __tablename__ = "clusters"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    api_version: Mapped[str] = mapped_column(String(64), nullable=False)
    region: Mapped[str | None] = mapped_column(ForeignKey("regions.name", ondelete="RESTRICT"))
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, nullable=False, default=dict)
    taints: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False, default=list)
    status: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # How the control worker reaches a real cluster (contracts/cluster.py; a reference to a mounted
    # Secret, never its content); NULL: simulated (migration 0007).
    connection: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The fleet file's metadata the fleet scheduler reads besides labels (migration 0012): annotations
    # (`berth.dev/draining`, `berth.dev/draining-pools`) and the Kubernetes deletionTimestamp: a draining cluster.
    annotations: Mapped[dict[str, str]] = mapped_column(JSONB, nullable=False, server_default="{}")
    deletion_timestamp: Mapped[str | None] = mapped_column(String(64))


class PoolRow(Base):
    __tablename__ = "pools"
    __table_args__ = (
        UniqueConstraint("cluster", "name"),
        CheckConstraint(_one_of("shape", POOL_SHAPES), name="shape"),
        CheckConstraint("node_count >= 0", name="node_count"),
        CheckConstraint("max_node_count IS NULL OR max_node_count >= 1", name="max_node_count"),
        CheckConstraint("shape = 'kubernetes' OR gpu_product IS NOT NULL", name="gpu_product"),
        CheckConstraint("max_lease_seconds IS NULL OR max_lease_seconds > 0", name="max_lease_seconds"),
        CheckConstraint("on_gpu_failure IN ('Tell', 'Replace')", name="on_gpu_failure"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(ForeignKey("clusters.name", ondelete="CASCADE"), nullable=False)
    name: Mapped[str] = mapped_column(String(253), nullable=False)
    position: Mapped[int] = mapped_column(Integer, nullable=False)  # published order within the cluster
    class_name: Mapped[str] = mapped_column(ForeignKey("inference_classes.name", ondelete="RESTRICT"), nullable=False)
    shape: Mapped[str] = mapped_column(String(16), nullable=False)
    gpu_product: Mapped[str | None] = mapped_column(String(64))
    node_count: Mapped[int] = mapped_column(Integer, nullable=False)
    max_node_count: Mapped[int | None] = mapped_column(Integer)  # an autoscaling kubernetes pool's ceiling
    node_template: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Per-state overall deadlines in seconds (fleet file `deadlines`); NULL: Timing's defaults (migration 0004).
    deadlines: Mapped[dict[str, float] | None] = mapped_column(JSONB)
    # The longest lease an allocation on this pool may have (fleet file `maxLease`); NULL: none (migration 0013).
    max_lease_seconds: Mapped[float | None] = mapped_column(Float)
    # What a failed GPU under an active allocation leads to (fleet file `onGpuFailure`; migration 0017).
    on_gpu_failure: Mapped[str] = mapped_column(String(16), nullable=False, server_default="Tell")


class NodeRow(Base):
    __tablename__ = "nodes"
    __table_args__ = (
        CheckConstraint(_one_of("status", NODE_STATUSES), name="status"),
        CheckConstraint("cpus > 0 AND memory_mib > 0 AND numa_nodes > 0", name="resources"),
    )

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    pool_id: Mapped[int] = mapped_column(ForeignKey("pools.id", ondelete="RESTRICT"), nullable=False, index=True)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    # What the fleet file says; `status` may differ while an operator has the node cordoned.
    declared_status: Mapped[str] = mapped_column(String(16), nullable=False)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, nullable=False, default=dict)
    cpus: Mapped[int] = mapped_column(Integer, nullable=False)
    memory_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    numa_nodes: Mapped[int] = mapped_column(Integer, nullable=False)
    simulation: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)


class SlotRow(Base):
    """One bundle of a host: GPU + fabric VF + NVMe + CPU + memory + MAC/IP (docs/seeds.md, "The GPU slice bundle")."""

    __tablename__ = "node_resource_slots"
    __table_args__ = (
        UniqueConstraint("node_id", "slot_index"),
        UniqueConstraint("node_id", "gpu_pci_address"),
        Index(
            "uq_node_resource_slots_node_id_fabric_vf",
            "node_id",
            "fabric_vf_pci_address",
            unique=True,
            postgresql_where=text("fabric_vf_pci_address IS NOT NULL AND fabric_vf_pci_address <> ''"),
        ),
        Index("ix_node_resource_slots_unavailable", "id", postgresql_where=text("state <> 'available'")),
        CheckConstraint(_one_of("state", SLOT_STATES), name="state"),
        CheckConstraint(_one_of("fabric_claim_mode", FABRIC_MODES), name="fabric_claim_mode"),
        CheckConstraint(_one_of("validation", VALIDATION_STATES), name="validation"),
        CheckConstraint(_one_of("health", HEALTH_STATES), name="health"),
        CheckConstraint("slot_index >= 0 AND numa_node >= 0 AND vcpus > 0 AND memory_mib > 0", name="resources"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), nullable=False)
    slot_index: Mapped[int] = mapped_column(Integer, nullable=False)
    gpu_pci_address: Mapped[str] = mapped_column(String(16), nullable=False)
    fabric_parent_pci_address: Mapped[str | None] = mapped_column(String(16))
    fabric_vf_pci_address: Mapped[str | None] = mapped_column(String(16))
    fabric_claim_mode: Mapped[str] = mapped_column(String(16), nullable=False)
    nvme_device: Mapped[str | None] = mapped_column(Text)
    numa_node: Mapped[int] = mapped_column(Integer, nullable=False)
    vcpus: Mapped[int] = mapped_column(Integer, nullable=False)
    memory_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    mac_address: Mapped[str | None] = mapped_column(String(17))
    private_ip: Mapped[str | None] = mapped_column(String(45))
    approved: Mapped[bool] = mapped_column(Boolean, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False, server_default="available")
    quarantine_reason: Mapped[str | None] = mapped_column(Text)
    # The node agent's check of this approved slot against its host: the operator approves (`approved`), the agent
    # validates (docs/seeds.md, "Approved slots, checked on the host"). Only approved and validated slots are ranked.
    validation: Mapped[str] = mapped_column(String(16), nullable=False, server_default="unvalidated")
    validation_reason: Mapped[str | None] = mapped_column(String(32))
    validation_message: Mapped[str | None] = mapped_column(Text)
    validated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Its health as its agent judged it (scheduler/host/health.py), kept at its worst since `repaired_at`:
    # only `healthy` slots are ranked; `health_reason` is the first of `health_reasons`.
    health: Mapped[str] = mapped_column(String(16), nullable=False, server_default="healthy")
    health_reason: Mapped[str | None] = mapped_column(Text)
    health_reasons: Mapped[list[str]] = mapped_column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    health_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # False for a verdict that ends with its cause (a stopped VM), not with a repair (migration 0023).
    health_lasting: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    repaired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Each signal's value in the agent's last health report, and when (migration 0017): `berth nodes get` shows them.
    health_signals: Mapped[dict[str, str]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    signals_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class NodeAgentRow(Base):
    """What the control plane knows of a node's agent: whether it is live, and the host it last reported.

    Kept apart from `nodes` on purpose: agents heartbeat every interval, and a write to `nodes` moves the inventory
    version (every control worker would reload its inventory). Only a change of `state` moves `liveness_version`.
    A node with no row has never had an agent report: it is not live.
    """

    __tablename__ = "node_agents"
    __table_args__ = (
        CheckConstraint(_one_of("state", AGENT_STATES), name="state"),
        Index("ix_node_agents_live_expiry", "expires_at", postgresql_where=text("state = 'live'")),
    )

    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    state: Mapped[str] = mapped_column(String(8), nullable=False)
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)  # live until then
    down_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    down_reason: Mapped[str | None] = mapped_column(Text)
    interval_seconds: Mapped[float] = mapped_column(Float, nullable=False)
    agent_version: Mapped[str | None] = mapped_column(String(64))
    topology: Mapped[str | None] = mapped_column(String(16))  # HostInventory.topology_hash() of `host`
    host: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # the last HostInventory reported
    host_reported_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    slices_blocked: Mapped[str | None] = mapped_column(Text)
    # The hash of the node's approved slots, and when it last changed: an API process answering heartbeats from
    # memory asks only for the nodes whose approval changed since it last looked.
    approved: Mapped[str | None] = mapped_column(String(16))
    approved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)


class TenantRow(Base):
    __tablename__ = "tenants"
    __table_args__ = (CheckConstraint("gpu_quota >= 0", name="gpu_quota"),)

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    gpu_quota: Mapped[int] = mapped_column(Integer, nullable=False)
    allowed_regions: Mapped[list[str] | None] = mapped_column(JSONB)
    required_jurisdiction: Mapped[str | None] = mapped_column(String(64))
    # {"creates_per_second", "burst"} (fleet.tenant.TenantRateLimit); NULL: no limit. Read by the API's create path.
    rate_limit: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Waiting for capacity (migration 0010): the fair-share weight, the PriorityClasses the tenant may name
    # (NULL: every class), and {"default_timeout", "max_timeout"} in seconds (fleet.tenant.TenantQueue).
    weight: Mapped[float] = mapped_column(Float, nullable=False, server_default="1")
    priority_classes: Mapped[list[str] | None] = mapped_column(JSONB)
    queue: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Borrowing and lending unused quota within a cohort (scheduler/quota/accounts.py); NULL limits: unlimited.
    cohort: Mapped[str | None] = mapped_column(String(253))
    borrowing_limit: Mapped[int | None] = mapped_column(Integer)
    lending_limit: Mapped[int | None] = mapped_column(Integer)
    # Nominal quotas per GPU product and region (migration 0011): [{"product", "region", "nominal",
    # "borrowing_limit", "lending_limit"}] (fleet.tenant.FlavorQuota); NULL: gpu_quota alone.
    quotas: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    # What its queued requests may displace (migration 0014): fleet.tenant.TenantPreemption, snake_case.
    preemption: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class CohortRow(Base):
    """A Cohort object (fleet/cohort.py): a node of a tree of tenants that lend each other quota. A cohort tenants
    name without a row here is a root with no quota of its own. No foreign key to the parent: a fleet file is
    validated whole (a parent that does not exist, a cycle) before it is written, and rows go in name order."""

    __tablename__ = "cohorts"
    __table_args__ = (
        CheckConstraint("gpu_quota >= 0", name="gpu_quota"),
        CheckConstraint("usage_half_life_seconds > 0", name="usage_half_life"),
        CheckConstraint(_one_of("quota_mode", COHORT_QUOTA_MODES), name="quota_mode"),
        CheckConstraint(
            "jsonb_typeof(preemption_strategies) = 'array' AND preemption_strategies <> '[]'::jsonb "
            f"AND preemption_strategies <@ '{json.dumps(FAIR_SHARING_STRATEGIES)}'::jsonb",
            name="preemption_strategies",
        ),
    )

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    parent_name: Mapped[str | None] = mapped_column(String(253))
    gpu_quota: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    borrowing_limit: Mapped[int | None] = mapped_column(Integer)
    lending_limit: Mapped[int | None] = mapped_column(Integer)
    # [{"product", "region", "nominal", "borrowing_limit", "lending_limit"}], as tenants.quotas.
    quotas: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False, server_default="[]")
    fair_sharing: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    weight: Mapped[float] = mapped_column(Float, nullable=False, server_default="1")
    # `fairSharing.usageHalfLife` on a fair-sharing root (migration 0021): order by decayed usage; NULL: by share.
    usage_half_life_seconds: Mapped[float | None] = mapped_column(Float)
    # `fairSharing.preemptionStrategies` (migration 0024): the fair-sharing strategies its tree's preemptions try,
    # in order; every cohort has Kueue's default pair unless its fleet file names others (on a fair-sharing root).
    preemption_strategies: Mapped[list[str]] = mapped_column(
        JSONB, nullable=False, server_default=json.dumps([s.value for s in DEFAULT_FAIR_SHARING_STRATEGIES])
    )
    # `quotaMode` (migration 0024): Additive (Kueue's Cohort) or Department (KAI-Scheduler's department).
    quota_mode: Mapped[str] = mapped_column(String(16), nullable=False, server_default="Additive")


class ApiTokenRow(Base):
    """Bearer tokens, stored as SHA-256 digests: a leaked database does not leak credentials."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint("(role IN ('viewer', 'member')) = (tenant IS NOT NULL)", name="role_tenant"),
        CheckConstraint("(role = 'node') = (node IS NOT NULL)", name="role_node"),
        CheckConstraint(_one_of("role", TOKEN_ROLES), name="role"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_sha256: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    tenant: Mapped[str | None] = mapped_column(ForeignKey("tenants.name", ondelete="CASCADE"))
    node: Mapped[str | None] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"))  # a node agent's token
    label: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # a service account's end (0022)


class AllocationRow(Base):
    __tablename__ = "allocations"
    __table_args__ = (
        CheckConstraint(_one_of("state", ALLOCATION_STATES), name="state"),
        CheckConstraint(_one_of("shape", ("gpu_slice", "baremetal")), name="shape"),
        CheckConstraint("gpu_count > 0", name="gpu_count"),
        UniqueConstraint("tenant", "idempotency_key"),
        # Keyset pages of `GET /v1/allocations`, newest first (migration 0009): all, and one tenant's.
        Index("ix_allocations_created_at_id", "created_at", "id"),
        Index("ix_allocations_tenant_created_at_id", "tenant", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="RESTRICT"), nullable=False, index=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    shape: Mapped[str] = mapped_column(String(16), nullable=False)
    gpu_count: Mapped[int] = mapped_column(Integer, nullable=False)
    gpu_product: Mapped[str | None] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    region: Mapped[str | None] = mapped_column(String(253))
    pool_id: Mapped[int | None] = mapped_column(ForeignKey("pools.id", ondelete="SET NULL"))
    node_id: Mapped[str | None] = mapped_column(String(253))
    workflow_id: Mapped[str] = mapped_column(String(255), nullable=False)
    requested_by: Mapped[str | None] = mapped_column(Text)  # the actor who asked for it (migration 0022)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    # GPUs beyond its tenant's nominal quota when its claims were recorded: it runs on quota borrowed from the
    # tenant's cohort (migration 0010), which preemption may reclaim.
    borrowed_gpus: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # When its lease ends and its release saga runs (migration 0013); NULL: no end.
    ends_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class ClaimRow(Base):
    """A slot held by an allocation. `released_at IS NULL` means active; the partial unique index below is the last
    line of defence against double allocation."""

    __tablename__ = "allocation_resource_claims"
    __table_args__ = (
        Index(
            "uq_allocation_resource_claims_active_slot",
            "slot_id",
            unique=True,
            postgresql_where=text("released_at IS NULL"),
        ),
        UniqueConstraint("allocation_id", "attempt", "slot_id"),
        CheckConstraint("attempt >= 1", name="attempt"),
        # The reconciler's comparison with the usage ledger reads the claims that changed lately (migration 0021).
        Index("ix_allocation_resource_claims_claimed_at", "claimed_at"),
        Index("ix_allocation_resource_claims_released_at", "released_at"),
        # History survives a slot being pruned from the fleet; an active claim always names its slot.
        CheckConstraint("released_at IS NOT NULL OR slot_id IS NOT NULL", name="active_has_slot"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    allocation_id: Mapped[str] = mapped_column(
        ForeignKey("allocations.id", ondelete="RESTRICT"), nullable=False, index=True
    )
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    slot_id: Mapped[int | None] = mapped_column(ForeignKey("node_resource_slots.id", ondelete="SET NULL"))
    node_id: Mapped[str] = mapped_column(String(253), nullable=False)
    bundle: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    claimed_at: Mapped[datetime] = _now()
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AllocationEventRow(Base):
    """The audit trail: one row per step, kept after Temporal's retention has dropped the history."""

    __tablename__ = "allocation_events"
    __table_args__ = (
        UniqueConstraint("allocation_id", "event_key"),
        # The breaker's recent failures per node (migration 0004): only failed attempts are indexed.
        Index(
            "ix_allocation_events_attempt_failed_at", "at", "node_id", postgresql_where=text("step = 'attempt_failed'")
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    allocation_id: Mapped[str] = mapped_column(
        ForeignKey("allocations.id", ondelete="CASCADE"), nullable=False, index=True
    )
    # Makes recording idempotent: the same (allocation, step, attempt, node) written twice is one row.
    event_key: Mapped[str] = mapped_column(String(255), nullable=False)
    at: Mapped[datetime] = _now()
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    step: Mapped[str] = mapped_column(String(64), nullable=False)
    attempt: Mapped[int | None] = mapped_column(Integer)
    node_id: Mapped[str | None] = mapped_column(String(253))
    reason: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    # Who asked for the step: a person or a service account (a release, a cancel); None: the control plane's own.
    actor: Mapped[str | None] = mapped_column(Text)


class ApiRequestRow(Base):
    """Every mutating API request, whoever made it and how it was answered (api/request_log.py)."""

    __tablename__ = "api_requests"
    __table_args__ = (Index("ix_api_requests_actor", "actor", "at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False, index=True)
    actor: Mapped[str] = mapped_column(Text, nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    method: Mapped[str] = mapped_column(String(8), nullable=False)
    route: Mapped[str] = mapped_column(Text, nullable=False)
    path: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[int] = mapped_column(Integer, nullable=False)


class ConsoleSessionRow(Base):
    """A web console session (console/sessions.py), or a login on its way to becoming one (`pending`). The row is
    found by the SHA-256 of the cookie's secret and holds the bearer sealed with a key only that secret gives: a
    leaked table leaks no credential, as with `api_tokens`."""

    __tablename__ = "console_sessions"
    __table_args__ = (CheckConstraint("kind IN ('pending', 'session')", name="kind"),)

    secret_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    sealed: Mapped[str] = mapped_column(Text, nullable=False)
    actor: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, index=True)


class RateLimitBucketRow(Base):
    """A token bucket every API process takes from (api/rate_limit.py): `tokens` as of `at`."""

    __tablename__ = "rate_limit_buckets"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    rate: Mapped[float] = mapped_column(Float, nullable=False)
    burst: Mapped[int] = mapped_column(Integer, nullable=False)
    tokens: Mapped[float] = mapped_column(Float, nullable=False)
    at: Mapped[float] = mapped_column(Float, nullable=False)  # epoch seconds, PostgreSQL's clock


class ModelDeploymentRow(Base):
    __tablename__ = "model_deployments"
    __table_args__ = (CheckConstraint("replicas >= 0", name="replicas"),)

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True, server_default="default")
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    replicas: Mapped[int] = mapped_column(Integer, nullable=False)
    status: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class ModelReplicaRow(Base):
    __tablename__ = "model_replicas"
    __table_args__ = (
        UniqueConstraint("namespace", "deployment", "cluster", "replica_index"),
        CheckConstraint("replica_index >= 0", name="replica_index"),
        ForeignKeyConstraint(
            ["namespace", "deployment"], ["model_deployments.namespace", "model_deployments.name"], ondelete="CASCADE"
        ),
    )

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True, server_default="default")
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(253), nullable=False)
    cluster: Mapped[str] = mapped_column(ForeignKey("clusters.name", ondelete="RESTRICT"), nullable=False)
    replica_index: Mapped[int] = mapped_column(Integer, nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    state: Mapped[str] = mapped_column(String(32), nullable=False, server_default="pending")
    created_at: Mapped[datetime] = _now()


class ReplicaPoolUsageRow(Base):
    """The node-cost ledger: what each replica's engines charge each pool (nodes = pods x copies)."""

    __tablename__ = "replica_pool_usage"
    __table_args__ = (
        UniqueConstraint("namespace", "replica", "engine"),
        CheckConstraint("nodes >= 0", name="nodes"),
        ForeignKeyConstraint(
            ["namespace", "replica"], ["model_replicas.namespace", "model_replicas.name"], ondelete="CASCADE"
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(String(253), nullable=False, server_default="default")
    replica: Mapped[str] = mapped_column(String(253), nullable=False)
    engine: Mapped[str] = mapped_column(String(253), nullable=False)
    pool_id: Mapped[int] = mapped_column(ForeignKey("pools.id", ondelete="RESTRICT"), nullable=False, index=True)
    nodes: Mapped[int] = mapped_column(Integer, nullable=False)


class ModelCacheRow(Base):
    """A ModelCache as applied with the fleet: where a model's weights stage, read for a deployment's
    modelCacheRef."""

    __tablename__ = "model_caches"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    api_version: Mapped[str] = mapped_column(String(64), nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    status: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class LivenessVersionRow(Base):
    """Moves whenever some node agent goes live or down: control workers re-read the down set only then."""

    __tablename__ = "liveness_version"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, nullable=False)


class InventoryVersionRow(Base):
    """One row whose counter database triggers move on every change to the placement inventory (migration 0002):
    control workers rebuild their cached snapshot only when it has moved (`store.inventory`)."""

    __tablename__ = "inventory_version"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, nullable=False)


class InventoryChangeRow(Base):
    """One node whose inventory rows changed (migration 0008, written by triggers only): control workers re-read just
    those nodes. `txid` is the writer's transaction id: readers keep their position in those, see the migration."""

    __tablename__ = "inventory_changes"
    __table_args__ = (Index("ix_inventory_changes_txid", "txid"), Index("ix_inventory_changes_at", "at"))

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253), nullable=False)
    txid: Mapped[int] = mapped_column(
        BigInteger, nullable=False, server_default=text("CAST(CAST(pg_current_xact_id() AS text) AS bigint)")
    )
    at: Mapped[datetime] = _now()


class InventoryChangesPrunedRow(Base):
    """The highest `inventory_changes.txid` pruned: a reader whose position is not above it reads the inventory whole."""

    __tablename__ = "inventory_changes_pruned"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    through: Mapped[int] = mapped_column(BigInteger, nullable=False)


class QueueEntryRow(Base):
    """An allocation waiting for capacity in a region's queue (migration 0010). It holds nothing: the row
    keeps the request's place (`arrival`, never renewed while it waits) and what the last admission pass decided
    for it: `node`, the node the pass set aside for it (counted as a plan in progress until the allocation's own
    placement takes it or the next pass moves it), or `reason`, why it is not placed yet, and `reserved_node`, the
    node held for it while it is the head that does not fit."""

    __tablename__ = "queue_entries"
    __table_args__ = (
        CheckConstraint("gpu_count > 0", name="gpu_count"),
        Index("ix_queue_entries_region_arrival", "region", "arrival"),
    )

    allocation_id: Mapped[str] = mapped_column(ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True)
    arrival: Mapped[int] = mapped_column(BigInteger, Identity(always=True), nullable=False, unique=True)
    tenant: Mapped[str] = mapped_column(String(253), nullable=False)
    region: Mapped[str] = mapped_column(String(253), nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    priority_class: Mapped[str | None] = mapped_column(String(253))
    gpu_count: Mapped[int] = mapped_column(Integer, nullable=False)
    request: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)  # contracts.placement.PlacementRequest
    enqueued_at: Mapped[datetime] = _now()
    deadline_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    node: Mapped[str | None] = mapped_column(String(253))
    reserved_node: Mapped[str | None] = mapped_column(
        String(253)
    )  # held for it as the head (scheduler/admission/admit.py)
    reason: Mapped[str | None] = mapped_column(Text)
    code: Mapped[str | None] = mapped_column(
        String(64)
    )  # the reason's code: quota_exceeded, insufficient_capacity, ...
    woken_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # last signalled to place itself
    # Preemption (migration 0014): the node the pass nominated for it and the allocations told to leave it
    # (or, when quota decided, only those), kept across passes until it is placed or leaves the queue.
    nominated_node: Mapped[str | None] = mapped_column(String(253))
    victims: Mapped[list[str] | None] = mapped_column(JSONB)
    nominated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # when the pass decided it


class ReservationRow(Base):
    """GPUs promised to a tenant on one node for a window (migration 0015): `reserved` until its start
    (its GPUs held from requests that would overlap it, `scheduler.admission.reservations.with_holds`), `started` once its
    allocation was asked for (held until that allocation claims them), then `ended`, `cancelled` or `failed`."""

    __tablename__ = "reservations"
    __table_args__ = (
        CheckConstraint("gpu_count > 0", name="gpu_count"),
        CheckConstraint("ends_at > starts_at", name="window"),
        CheckConstraint(_one_of("state", RESERVATION_STATES), name="state"),
        Index("ix_reservations_state_node", "state", "node_id"),
        Index("ix_reservations_tenant_starts_at", "tenant", "starts_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="RESTRICT"), nullable=False)
    region: Mapped[str] = mapped_column(String(253), nullable=False)
    node_id: Mapped[str] = mapped_column(String(253), nullable=False)
    gpu_count: Mapped[int] = mapped_column(Integer, nullable=False)
    gpu_product: Mapped[str | None] = mapped_column(String(64))
    shape: Mapped[str] = mapped_column(String(16), nullable=False)
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    ends_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    allocation_id: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


USAGE_KINDS = ("allocation", "replica", "reservation")


class UsageIntervalRow(Base):
    """The usage ledger (migration 0021): one billed interval. Written only by the database's triggers on claims,
    replica ledger rows and reservations, in the transaction that changed them (store/usage.py says what starts and
    ends one); the application reads it, rolls it up and repairs it, never writes it on the way."""

    __tablename__ = "usage_intervals"
    __table_args__ = (
        UniqueConstraint("kind", "subject", "attempt"),
        CheckConstraint(_one_of("kind", USAGE_KINDS), name="kind"),
        CheckConstraint("ended_at IS NULL OR ended_at >= started_at", name="ordered"),
        Index(
            "ix_usage_intervals_span",
            text("tstzrange(started_at, coalesce(ended_at, 'infinity'::timestamptz))"),
            postgresql_using="gist",
        ),
        Index("ix_usage_intervals_tenant_ended_at", "kind", "tenant", "ended_at"),
        Index("ix_usage_intervals_open", "kind", "tenant", postgresql_where=text("ended_at IS NULL")),
        Index("ix_usage_intervals_subject", "subject"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    subject: Mapped[str] = mapped_column(String(800), nullable=False)  # allocation id, replica/engine, reservation
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    tenant: Mapped[str] = mapped_column(String(270), nullable=False)  # a replica's: namespace:<namespace>
    gpu_product: Mapped[str | None] = mapped_column(String(64))
    region: Mapped[str | None] = mapped_column(String(253))
    pool: Mapped[str | None] = mapped_column(String(507))  # cluster/pool
    priority_class: Mapped[str | None] = mapped_column(String(253))
    shape: Mapped[str | None] = mapped_column(String(16))
    node_id: Mapped[str | None] = mapped_column(String(253))
    gpus: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    nodes: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    end_reason: Mapped[str | None] = mapped_column(String(32))
    first: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="true")  # its allocation's first


class UsageTotalRow(Base):
    """GPU- and node-seconds of closed intervals per (kind, tenant, product, region), added at each close: the
    counters' source, small whatever the ledger's size."""

    __tablename__ = "usage_totals"

    kind: Mapped[str] = mapped_column(String(507), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(507), primary_key=True)
    gpu_product: Mapped[str] = mapped_column(String(507), primary_key=True)
    region: Mapped[str] = mapped_column(String(507), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    node_seconds: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")


class UsageHourlyRow(Base):
    """Intervals older than the retention, rolled up per hour and key ('' for a key an interval has none of)."""

    __tablename__ = "usage_hourly"

    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    kind: Mapped[str] = mapped_column(String(507), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(507), primary_key=True)
    gpu_product: Mapped[str] = mapped_column(String(507), primary_key=True)
    region: Mapped[str] = mapped_column(String(507), primary_key=True)
    pool: Mapped[str] = mapped_column(String(507), primary_key=True)
    priority_class: Mapped[str] = mapped_column(String(507), primary_key=True)
    shape: Mapped[str] = mapped_column(String(507), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    node_seconds: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    allocations: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")  # first intervals begun
    peak_gpus: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")


class UsageRollupRow(Base):
    """One row: the instant before which `usage_hourly` holds the usage (NULL: nothing rolled up yet)."""

    __tablename__ = "usage_rollup"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rolled_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UsageDecayRow(Base):
    """A tenant's decayed GPU-seconds at `as_of`, for one half-life: folded forward by the admission pass."""

    __tablename__ = "usage_decay"

    tenant: Mapped[str] = mapped_column(String(270), primary_key=True)
    half_life_seconds: Mapped[float] = mapped_column(Float, primary_key=True)
    as_of: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    value: Mapped[float] = mapped_column(Float, nullable=False)
