"""preemption

- `tenants.preemption`: what the tenant's queued requests may displace (fleet.tenant.TenantPreemption).
- `priority_classes.preemptible`, `grace_seconds`: spot classes anyone may displace; the notice before a release.
- `queue_entries.nominated_node`, `victims`, `nominated_at`: the node an admission pass freed for a queued request,
  the allocations it told to leave and when it decided, kept until the request is placed or leaves the queue (the
  reconciler reports a node held so that another allocation took).
- `allocations.state` may be `preempting` (told to leave, in its grace period) and `preempted`.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

STATES = ("pending", "queued", "placing", "planning", "claiming", "provisioning", "waiting_ready", "active",
          "releasing", "released", "failed", "cancelled", "expired")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.add_column("tenants", sa.Column("preemption", postgresql.JSONB()))
    op.add_column("priority_classes", sa.Column("preemptible", sa.Boolean(), nullable=False, server_default="false"))
    op.add_column("priority_classes", sa.Column("grace_seconds", sa.Float(), nullable=False, server_default="30"))
    op.add_column("queue_entries", sa.Column("nominated_node", sa.String(253)))
    op.add_column("queue_entries", sa.Column("victims", postgresql.JSONB()))
    op.add_column("queue_entries", sa.Column("nominated_at", sa.DateTime(timezone=True)))
    op.drop_constraint(op.f("ck_allocations_state"), "allocations", type_="check")
    op.create_check_constraint(
        op.f("ck_allocations_state"), "allocations", _one_of("state", (*STATES, "preempting", "preempted"))
    )


def downgrade() -> None:
    op.execute("UPDATE allocations SET state = 'active' WHERE state = 'preempting'")
    op.execute("UPDATE allocations SET state = 'released' WHERE state = 'preempted'")
    op.drop_constraint(op.f("ck_allocations_state"), "allocations", type_="check")
    op.create_check_constraint(op.f("ck_allocations_state"), "allocations", _one_of("state", STATES))
    op.drop_column("queue_entries", "nominated_at")
    op.drop_column("queue_entries", "victims")
    op.drop_column("queue_entries", "nominated_node")
    op.drop_column("priority_classes", "grace_seconds")
    op.drop_column("priority_classes", "preemptible")
    op.drop_column("tenants", "preemption")
