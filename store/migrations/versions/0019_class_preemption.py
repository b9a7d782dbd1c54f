"""a PriorityClass that never preempts, and one that is never preempted

- `priority_classes.never_preempts`: fleet file `preemptionPolicy: Never` (Kubernetes' PriorityClass field): its
  queued requests displace nobody.
- `priority_classes.non_preemptible`: fleet file `nonPreemptible: true` (KAI-Scheduler's non-preemptible
  workloads): never a victim, and admitted only within its tenant's nominal quota.

Both false for every class that existed before, which keeps their behaviour.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("priority_classes", sa.Column("never_preempts", sa.Boolean(), nullable=False, server_default="false"))
    op.add_column(
        "priority_classes", sa.Column("non_preemptible", sa.Boolean(), nullable=False, server_default="false")
    )


def downgrade() -> None:
    op.drop_column("priority_classes", "non_preemptible")
    op.drop_column("priority_classes", "never_preempts")
