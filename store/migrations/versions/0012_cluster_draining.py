"""cluster draining: the InferenceCluster metadata the fleet scheduler reads to drain a cluster

- `clusters.annotations`: the fleet file's annotations (`berth.dev/draining`, `berth.dev/draining-pools`, ...).
- `clusters.deletion_timestamp`: the Kubernetes `metadata.deletionTimestamp`, when the file carries one.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("clusters", sa.Column("annotations", postgresql.JSONB(), nullable=False, server_default="{}"))
    op.add_column("clusters", sa.Column("deletion_timestamp", sa.String(64)))


def downgrade() -> None:
    op.drop_column("clusters", "deletion_timestamp")
    op.drop_column("clusters", "annotations")
