"""allocations with an end

- `allocations.ends_at`: when an active allocation's lease ends (its release saga then runs); NULL: no end.
- `allocations.state` may be `expired`: released because its lease ended.
- `pools.max_lease_seconds`: the longest lease the pool grants (fleet file `maxLease`); NULL: no maximum.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

STATES = ("pending", "queued", "placing", "planning", "claiming", "provisioning", "waiting_ready", "active",
          "releasing", "released", "failed", "cancelled")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.add_column("allocations", sa.Column("ends_at", sa.DateTime(timezone=True)))
    op.add_column("pools", sa.Column("max_lease_seconds", sa.Float()))
    op.create_check_constraint(
        op.f("ck_pools_max_lease_seconds"), "pools", "max_lease_seconds IS NULL OR max_lease_seconds > 0"
    )
    op.drop_constraint(op.f("ck_allocations_state"), "allocations", type_="check")
    op.create_check_constraint(op.f("ck_allocations_state"), "allocations", _one_of("state", (*STATES, "expired")))


def downgrade() -> None:
    op.execute("UPDATE allocations SET state = 'released' WHERE state = 'expired'")
    op.drop_constraint(op.f("ck_allocations_state"), "allocations", type_="check")
    op.create_check_constraint(op.f("ck_allocations_state"), "allocations", _one_of("state", STATES))
    op.drop_constraint(op.f("ck_pools_max_lease_seconds"), "pools", type_="check")
    op.drop_column("pools", "max_lease_seconds")
    op.drop_column("allocations", "ends_at")
