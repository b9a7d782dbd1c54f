"""queues: waiting for capacity with priorities and fair share

- `queue_entries`: an allocation waiting in a region's queue, with its place (`arrival`, an identity column: the
  order of arrival, kept while it waits), priority, deadline, and what the last admission pass decided for it.
- `priority_classes`: the fleet file's PriorityClasses; at most one default (a partial unique index).
- `tenants.weight`, `tenants.priority_classes`, `tenants.queue`: fair-share weight, the classes a tenant may name,
  and its waiting defaults; `tenants.cohort`, `borrowing_limit`, `lending_limit`: quota lent within a cohort;
  `allocations.borrowed_gpus`: GPUs it holds beyond its tenant's quota; `regions.queueing_strategy`.
- `allocations.state` may be `queued`.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

STATES = ("pending", "placing", "planning", "claiming", "provisioning", "waiting_ready", "active", "releasing",
          "released", "failed", "cancelled")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_allocations_state"), "allocations", type_="check")
    op.create_check_constraint(op.f("ck_allocations_state"), "allocations", _one_of("state", ("queued", *STATES)))
    op.add_column("tenants", sa.Column("weight", sa.Float(), nullable=False, server_default="1"))
    op.add_column("tenants", sa.Column("priority_classes", postgresql.JSONB()))
    op.add_column("tenants", sa.Column("queue", postgresql.JSONB()))
    op.add_column("tenants", sa.Column("cohort", sa.String(253)))
    op.add_column("tenants", sa.Column("borrowing_limit", sa.Integer()))
    op.add_column("tenants", sa.Column("lending_limit", sa.Integer()))
    op.add_column("allocations", sa.Column("borrowed_gpus", sa.Integer(), nullable=False, server_default="0"))
    op.add_column(
        "regions", sa.Column("queueing_strategy", sa.String(16), nullable=False, server_default="BestEffortFIFO")
    )
    op.create_check_constraint(
        op.f("ck_regions_queueing_strategy"), "regions", _one_of("queueing_strategy", ("StrictFIFO", "BestEffortFIFO"))
    )
    op.create_table(
        "priority_classes",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("description", sa.Text()),
    )
    op.create_index(
        "uq_priority_classes_default",
        "priority_classes",
        ["is_default"],
        unique=True,
        postgresql_where=sa.text("is_default"),
    )
    op.create_table(
        "queue_entries",
        sa.Column(
            "allocation_id", sa.String(64), sa.ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("arrival", sa.BigInteger(), sa.Identity(always=True), nullable=False, unique=True),
        sa.Column("tenant", sa.String(253), nullable=False),
        sa.Column("region", sa.String(253), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("priority_class", sa.String(253)),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("request", postgresql.JSONB(), nullable=False),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(253)),
        sa.Column("reserved_node", sa.String(253)),
        sa.Column("reason", sa.Text()),
        sa.Column("code", sa.String(64)),
        sa.Column("woken_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("gpu_count > 0", name=op.f("ck_queue_entries_gpu_count")),
    )
    op.create_index("ix_queue_entries_region_arrival", "queue_entries", ["region", "arrival"])


def downgrade() -> None:
    op.drop_index("ix_queue_entries_region_arrival", table_name="queue_entries")
    op.drop_table("queue_entries")
    op.drop_index("uq_priority_classes_default", table_name="priority_classes")
    op.drop_table("priority_classes")
    op.drop_constraint(op.f("ck_regions_queueing_strategy"), "regions", type_="check")
    op.drop_column("regions", "queueing_strategy")
    op.drop_column("allocations", "borrowed_gpus")
    op.drop_column("tenants", "lending_limit")
    op.drop_column("tenants", "borrowing_limit")
    op.drop_column("tenants", "cohort")
    op.drop_column("tenants", "queue")
    op.drop_column("tenants", "priority_classes")
    op.drop_column("tenants", "weight")
    op.execute("DELETE FROM allocations WHERE state = 'queued'")
    op.drop_constraint(op.f("ck_allocations_state"), "allocations", type_="check")
    op.create_check_constraint(op.f("ck_allocations_state"), "allocations", _one_of("state", STATES))
