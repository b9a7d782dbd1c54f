"""tenant rate limit and keyset paging of allocations

- `tenants.rate_limit` (JSONB, NULL: no limit): the fleet file's `spec.rateLimit` of a Tenant, `{creates_per_second,
  burst}`, which the API's create path reads to size the tenant's token bucket.
- `GET /v1/allocations` pages by `(created_at, id)`, newest first, with a cursor instead of stopping at `limit`:
  two indexes let a page start where the last one ended without sorting every row before it, for all tenants (an
  admin's list) and for one tenant (a tenant token's list, and an admin's `?tenant=`).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("rate_limit", postgresql.JSONB()))
    op.create_index("ix_allocations_created_at_id", "allocations", ["created_at", "id"])
    op.create_index("ix_allocations_tenant_created_at_id", "allocations", ["tenant", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_allocations_tenant_created_at_id", table_name="allocations")
    op.drop_index("ix_allocations_created_at_id", table_name="allocations")
    op.drop_column("tenants", "rate_limit")
