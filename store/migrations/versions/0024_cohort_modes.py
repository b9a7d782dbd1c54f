"""a Cohort's fair-sharing preemption strategies and its quota mode

- `cohorts.preemption_strategies`: a fair-sharing root's `fairSharing.preemptionStrategies`, the strategies its
  tree's preemptions try, in order (Kueue's names). Every cohort stored before keeps Kueue's default pair,
  LessThanOrEqualToFinalShare then LessThanInitialShare, which is what fair-sharing preemption did until now.
- `cohorts.quota_mode`: `Additive` (Kueue's Cohort: its quota adds to its members') or `Department`
  (KAI-Scheduler's department: its quota bounds what its members use together). Every cohort stored before is
  Additive, as it was.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

STRATEGIES = '["LessThanOrEqualToFinalShare", "LessThanInitialShare"]'  # every name, and Kueue's default order


def upgrade() -> None:
    op.add_column("cohorts", sa.Column("preemption_strategies", JSONB(), nullable=False, server_default=STRATEGIES))
    op.create_check_constraint(
        "preemption_strategies",
        "cohorts",
        "jsonb_typeof(preemption_strategies) = 'array' AND preemption_strategies <> '[]'::jsonb "
        f"AND preemption_strategies <@ '{STRATEGIES}'::jsonb",
    )
    op.add_column("cohorts", sa.Column("quota_mode", sa.String(16), nullable=False, server_default="Additive"))
    op.create_check_constraint("quota_mode", "cohorts", "quota_mode IN ('Additive', 'Department')")


def downgrade() -> None:
    op.drop_constraint("quota_mode", "cohorts", type_="check")
    op.drop_column("cohorts", "quota_mode")
    op.drop_constraint("preemption_strategies", "cohorts", type_="check")
    op.drop_column("cohorts", "preemption_strategies")
