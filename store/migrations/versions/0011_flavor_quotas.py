"""flavor quotas: a tenant's nominal quota per GPU product and region

- `tenants.quotas`: the fleet file's `quotas`, [{"product", "region", "nominal", "borrowing_limit",
  "lending_limit"}]; NULL: the tenant's `gpu_quota` alone, as before.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("quotas", postgresql.JSONB()))


def downgrade() -> None:
    op.drop_column("tenants", "quotas")
