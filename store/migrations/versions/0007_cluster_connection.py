"""clusters.connection: how the control worker reaches a real cluster's API server (a reference, not a secret)

A JSON object (`contracts/cluster.py` ClusterConnection: `method` kubeconfig or in-cluster,
`secretName`/`secretKey` of the mounted kubeconfig Secret, `context`, `gateway`), NULL for a cluster that has
none and stays on the simulated driver. The Secret's content never reaches the database.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("clusters", sa.Column("connection", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("clusters", "connection")
