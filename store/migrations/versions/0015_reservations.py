"""reservations

`reservations`: GPUs promised to a tenant on one node for a window `[starts_at, ends_at)`: `reserved` until its
start, `started` once its allocation (`allocation_id`) has been asked for, then `ended` (its allocation ended),
`cancelled` or `failed`.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(253), sa.ForeignKey("tenants.name", ondelete="RESTRICT"), nullable=False),
        sa.Column("region", sa.String(253), nullable=False),
        sa.Column("node_id", sa.String(253), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_product", sa.String(64)),
        sa.Column("shape", sa.String(16), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("allocation_id", sa.String(64)),
        sa.Column("reason", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("gpu_count > 0", name=op.f("ck_reservations_gpu_count")),
        sa.CheckConstraint("ends_at > starts_at", name=op.f("ck_reservations_window")),
        sa.CheckConstraint(
            "state IN ('reserved', 'started', 'ended', 'cancelled', 'failed')", name=op.f("ck_reservations_state")
        ),
    )
    op.create_index("ix_reservations_state_node", "reservations", ["state", "node_id"])
    op.create_index("ix_reservations_tenant_starts_at", "reservations", ["tenant", "starts_at"])


def downgrade() -> None:
    op.drop_table("reservations")
