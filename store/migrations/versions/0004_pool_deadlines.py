"""pool deadlines and the node breaker's index

`pools.deadlines` holds a pool's per-state overall deadlines from the fleet file (seconds by
state name; NULL: the defaults from `workflows.allocation.messages.Timing`). The pools trigger of migration 0002
already moves `inventory_version` on any change to the row, so control workers pick new deadlines up with the rest
of the inventory.

The partial index serves the breaker: on every placement decision the control worker asks which nodes had failed
attempts within the breaker's window. Only `attempt_failed` rows are indexed, so the index stays small and the
query is an index range scan however long the audit trail grows.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BREAKER_INDEX = "ix_allocation_events_attempt_failed_at"


def upgrade() -> None:
    op.add_column("pools", sa.Column("deadlines", postgresql.JSONB()))
    op.create_index(
        BREAKER_INDEX,
        "allocation_events",
        ["at", "node_id"],
        postgresql_where=sa.text("step = 'attempt_failed'"),
    )


def downgrade() -> None:
    op.drop_index(BREAKER_INDEX, table_name="allocation_events")
    op.drop_column("pools", "deadlines")
