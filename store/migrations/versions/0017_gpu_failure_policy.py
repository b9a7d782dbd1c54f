"""a pool's policy for a failed GPU under an active allocation, and each slot's last health signals

- `pools.on_gpu_failure`: `Tell` (the allocation goes `degraded` and keeps running) or `Replace` (it also moves to
  a healthy node); fleet file `onGpuFailure`, `Tell` for every pool that existed before.
- `node_resource_slots.health_signals`, `signals_at`: each signal's value in the agent's last health report (not
  watched by the inventory change log: values move, verdicts are what placement reads).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pools", sa.Column("on_gpu_failure", sa.String(16), nullable=False, server_default="Tell"))
    op.create_check_constraint(op.f("ck_pools_on_gpu_failure"), "pools", "on_gpu_failure IN ('Tell', 'Replace')")
    op.add_column(
        "node_resource_slots",
        sa.Column("health_signals", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.add_column("node_resource_slots", sa.Column("signals_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("node_resource_slots", "signals_at")
    op.drop_column("node_resource_slots", "health_signals")
    op.drop_constraint(op.f("ck_pools_on_gpu_failure"), "pools", type_="check")
    op.drop_column("pools", "on_gpu_failure")
