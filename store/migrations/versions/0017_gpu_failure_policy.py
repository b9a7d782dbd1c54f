"""a pool's policy for a failed GPU under an active allocation (issue 27)

- `pools.on_gpu_failure`: `Tell` (the allocation goes `degraded` and keeps running) or `Replace` (it also moves to
  a healthy node); fleet file `onGpuFailure`, `Tell` for every pool that existed before.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pools", sa.Column("on_gpu_failure", sa.String(16), nullable=False, server_default="Tell"))
    op.create_check_constraint(op.f("ck_pools_on_gpu_failure"), "pools", "on_gpu_failure IN ('Tell', 'Replace')")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_pools_on_gpu_failure"), "pools", type_="check")
    op.drop_column("pools", "on_gpu_failure")
