"""Cohort objects: hierarchical cohorts, a cohort's own quota and limits, fair sharing per tree

- `cohorts`: one row per Cohort object of the fleet file (fleet/cohort.py): its parent, its own GPU quota, its
  borrowing and lending limits, its own per-product quotas, and on a root whether fair sharing decides in its tree.

A cohort that tenants name without a Cohort object is a root with no quota of its own, so every fleet applied
before this revision keeps its cohorts exactly as they were.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cohorts",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("parent_name", sa.String(253), nullable=True),
        sa.Column("gpu_quota", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("borrowing_limit", sa.Integer(), nullable=True),
        sa.Column("lending_limit", sa.Integer(), nullable=True),
        sa.Column("quotas", JSONB(), nullable=False, server_default="[]"),
        sa.Column("fair_sharing", sa.Boolean(), nullable=False, server_default="false"),
        sa.Column("weight", sa.Float(), nullable=False, server_default="1"),
        sa.CheckConstraint("gpu_quota >= 0", name=op.f("ck_cohorts_gpu_quota")),
    )
    # Cohorts are part of the inventory the control workers cache, as tenants are (migration 0002).
    op.execute(
        "CREATE TRIGGER cohorts_inventory_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON cohorts "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )


def downgrade() -> None:
    op.drop_table("cohorts")
