"""the reconciler's records: audit runs, their findings, and every repair

A Temporal Schedule runs the `Reconcile` workflow every minute; each run is an `audit_runs` row
with its `audit_findings` (kind, node, allocation, slots, message, first_seen, the repair it would take or why not).
`audit_repairs` is the reconciler's own trail, never pruned: a run that is pruned leaves its repairs in place
(`run_id` set to NULL). Nothing here touches the inventory, so no inventory trigger is involved.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_runs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("workflow_id", sa.String(255), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("repair", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("nodes_checked", postgresql.JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_runs")),
    )
    op.create_index(op.f("ix_audit_runs_finished_at"), "audit_runs", ["finished_at"])
    op.create_table(
        "audit_findings",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("node", sa.String(253)),
        sa.Column("allocation_id", sa.String(255)),
        sa.Column("slot_indexes", postgresql.JSONB(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("repair", sa.String(32)),
        sa.Column("blocked", sa.Text()),
        sa.ForeignKeyConstraint(
            ["run_id"], ["audit_runs.id"], name=op.f("fk_audit_findings_run_id_audit_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_findings")),
    )
    op.create_index(op.f("ix_audit_findings_run_id"), "audit_findings", ["run_id"])
    op.create_table(
        "audit_repairs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.BigInteger()),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("node", sa.String(253)),
        sa.Column("allocation_id", sa.String(255)),
        sa.Column("slot_indexes", postgresql.JSONB(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["audit_runs.id"], name=op.f("fk_audit_repairs_run_id_audit_runs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_repairs")),
    )
    op.create_index(op.f("ix_audit_repairs_run_id"), "audit_repairs", ["run_id"])


def downgrade() -> None:
    op.drop_table("audit_repairs")
    op.drop_table("audit_findings")
    op.drop_table("audit_runs")
