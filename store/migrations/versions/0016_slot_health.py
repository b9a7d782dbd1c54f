"""slot health: each approved slot's health verdict as its agent last judged it, kept at its worst since
the slot's last repair

`node_resource_slots.health` (`healthy`, `unknown`, `degraded`, `failed`), `health_reasons` (the reasons, most
severe first), `health_at` (when the verdict last changed) and `repaired_at`. A change of `health` or of its first
reason logs the node in `inventory_changes`, as a change of validation does, so placement stops choosing the slot
within one report: the slots trigger of migration 0008 is recreated with the two columns added.

`allocations.state` may be `degraded`: active on a slot whose GPU failed; its owner was told (a hold state, as
`active` is).

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

OLD_COLUMNS = (
    "node_id", "slot_index", "gpu_pci_address", "fabric_parent_pci_address", "fabric_vf_pci_address",
    "fabric_claim_mode", "nvme_device", "numa_node", "vcpus", "memory_mib", "mac_address", "private_ip", "approved",
    "validation", "validation_reason",
)
NEW_COLUMNS = (*OLD_COLUMNS, "health", "health_reason")
STATES = ("pending", "queued", "placing", "planning", "claiming", "provisioning", "waiting_ready", "active",
          "releasing", "released", "failed", "cancelled", "expired", "preempting", "preempted")


def _states(states: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_allocations_state"), "allocations", type_="check")
    op.create_check_constraint(
        op.f("ck_allocations_state"), "allocations", f"state IN ({', '.join(repr(s) for s in states)})"
    )


def _trigger(columns: tuple[str, ...]) -> str:
    row = ", ".join(f"{{0}}.{column}" for column in columns)
    return (
        f"CREATE TRIGGER node_resource_slots_changed AFTER UPDATE OF {', '.join(columns)} ON node_resource_slots "
        f"FOR EACH ROW WHEN (({row.format('OLD')}) IS DISTINCT FROM ({row.format('NEW')})) "
        "EXECUTE FUNCTION log_inventory_row()"
    )


def upgrade() -> None:
    op.add_column("node_resource_slots", sa.Column("health", sa.String(16), nullable=False, server_default="healthy"))
    op.add_column("node_resource_slots", sa.Column("health_reason", sa.Text()))
    op.add_column(
        "node_resource_slots",
        sa.Column("health_reasons", postgresql.JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
    )
    op.add_column("node_resource_slots", sa.Column("health_at", sa.DateTime(timezone=True)))
    op.add_column("node_resource_slots", sa.Column("repaired_at", sa.DateTime(timezone=True)))
    op.create_check_constraint(
        "health", "node_resource_slots", "health IN ('healthy', 'unknown', 'degraded', 'failed')"
    )
    op.execute("DROP TRIGGER node_resource_slots_changed ON node_resource_slots")
    op.execute(_trigger(NEW_COLUMNS))
    _states((*STATES, "degraded"))


def downgrade() -> None:
    op.execute("UPDATE allocations SET state = 'active' WHERE state = 'degraded'")
    _states(STATES)
    op.execute("DROP TRIGGER node_resource_slots_changed ON node_resource_slots")
    op.execute(_trigger(OLD_COLUMNS))
    op.drop_constraint(op.f("ck_node_resource_slots_health"), "node_resource_slots", type_="check")
    for column in ("repaired_at", "health_at", "health_reasons", "health_reason", "health"):
        op.drop_column("node_resource_slots", column)
