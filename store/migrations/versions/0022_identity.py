"""identity: roles for tokens, who did what, and rate limits every API process shares

- `api_tokens.role` is one of the roles a person can have too: `viewer` and `member` act within one tenant (the
  token's `tenant`), `operator` and `admin` on every tenant; `node` stays a node agent's. Tenant tokens become
  `member` tokens (what they could do). `expires_at`: a service account's token stops working then.
- `allocations.requested_by` and `allocation_events.actor`: who asked for an allocation, and who asked for each step
  that a request caused (a release, a cancel, a retry, an extension); the control plane's own steps have none.
- `api_requests`: every mutating API request, whoever made it (a person, a service account, an agent) and how it
  was answered: the operator's actions on nodes, the fleet and deployments are there as much as the tenants'.
- `rate_limit_buckets`: the token buckets of the per-tenant and per-person limits, in PostgreSQL so that every API
  replica takes from the same bucket.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


# Why an attempt's interval ended (migration 0021), read from the workflow's own steps only: a request someone made
# (`release_requested`, whose key begins `request:`) is written before the steps that carry it out.
_END_REASON = """
CREATE OR REPLACE FUNCTION usage_end_reason(allocation text) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT coalesce(
    (SELECT CASE e.step
              WHEN 'release' THEN 'released' WHEN 'expire' THEN 'expired' WHEN 'preempt' THEN 'preempted'
              WHEN 'cancel' THEN 'cancelled' WHEN 'replace' THEN 'replaced' WHEN 'attempt_failed' THEN 'attempt_failed'
              WHEN 'failed' THEN 'failed' END
       FROM allocation_events AS e
      WHERE e.allocation_id = allocation AND left(e.event_key, 8) <> 'request:'
      ORDER BY e.id DESC LIMIT 1),
    (SELECT a.state FROM allocations AS a
      WHERE a.id = allocation AND a.state IN ('released', 'failed', 'cancelled', 'expired', 'preempted')))
$$
"""


def upgrade() -> None:
    op.drop_constraint(op.f("ck_api_tokens_role"), "api_tokens", type_="check")
    op.drop_constraint(op.f("ck_api_tokens_role_tenant"), "api_tokens", type_="check")
    op.execute("UPDATE api_tokens SET role = 'member' WHERE role = 'tenant'")
    op.create_check_constraint(
        op.f("ck_api_tokens_role"), "api_tokens", "role IN ('viewer', 'member', 'operator', 'admin', 'node')"
    )
    op.create_check_constraint(
        op.f("ck_api_tokens_role_tenant"), "api_tokens", "(role IN ('viewer', 'member')) = (tenant IS NOT NULL)"
    )
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True)))

    op.add_column("allocations", sa.Column("requested_by", sa.Text()))
    op.add_column("allocation_events", sa.Column("actor", sa.Text()))
    op.execute(_END_REASON)

    op.create_table(
        "api_requests",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("route", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_requests")),
    )
    op.create_index(op.f("ix_api_requests_at"), "api_requests", ["at"])
    op.create_index(op.f("ix_api_requests_actor"), "api_requests", ["actor", "at"])

    op.create_table(
        "rate_limit_buckets",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("burst", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),  # epoch seconds, PostgreSQL's clock
        sa.PrimaryKeyConstraint("key", name=op.f("pk_rate_limit_buckets")),
    )


def downgrade() -> None:
    op.drop_table("rate_limit_buckets")
    op.drop_index(op.f("ix_api_requests_actor"), table_name="api_requests")
    op.drop_index(op.f("ix_api_requests_at"), table_name="api_requests")
    op.drop_table("api_requests")
    op.execute(_END_REASON.replace(" AND left(e.event_key, 8) <> 'request:'", ""))
    op.drop_column("allocation_events", "actor")
    op.drop_column("allocations", "requested_by")
    op.drop_column("api_tokens", "expires_at")
    op.execute("DELETE FROM api_tokens WHERE role IN ('viewer', 'operator')")
    op.drop_constraint(op.f("ck_api_tokens_role_tenant"), "api_tokens", type_="check")
    op.drop_constraint(op.f("ck_api_tokens_role"), "api_tokens", type_="check")
    op.execute("UPDATE api_tokens SET role = 'tenant' WHERE role = 'member'")
    op.create_check_constraint(op.f("ck_api_tokens_role"), "api_tokens", "role IN ('admin', 'tenant', 'node')")
    op.create_check_constraint(op.f("ck_api_tokens_role_tenant"), "api_tokens", "(role = 'tenant') = (tenant IS NOT NULL)")
