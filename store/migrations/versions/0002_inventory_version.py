"""inventory version: a counter that moves whenever the placement inventory changes

Control workers keep the scheduler's snapshot of the inventory between requests and rebuild it only when this
counter has moved. Triggers move it, so no writer (the apply, a cordon, an operator's manual SQL) can forget to.
Claims and a slot's state (reserved, quarantined) are not inventory: they are read fresh for every decision.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Every table the placement snapshot is built from, and for slot rows every column but the claim-time ones.
WHOLE_TABLES = ("regions", "inference_classes", "clusters", "pools", "nodes", "tenants")
SLOT_INVENTORY_COLUMNS = (
    "node_id", "slot_index", "gpu_pci_address", "fabric_parent_pci_address", "fabric_vf_pci_address",
    "fabric_claim_mode", "nvme_device", "numa_node", "vcpus", "memory_mib", "mac_address", "private_ip", "approved",
)


def upgrade() -> None:
    op.create_table(
        "inventory_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_inventory_version_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inventory_version")),
    )
    op.execute("INSERT INTO inventory_version (id, version) VALUES (1, 1)")
    op.execute(
        """
        CREATE FUNCTION bump_inventory_version() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE inventory_version SET version = version + 1 WHERE id = 1;
            RETURN NULL;
        END $$
        """
    )
    # Every decision reads the slots that are not available; on a mostly free fleet that is a small part.
    op.create_index(
        "ix_node_resource_slots_unavailable",
        "node_resource_slots",
        ["id"],
        postgresql_where=sa.text("state <> 'available'"),
    )
    for table in WHOLE_TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_inventory_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
        )
    op.execute(
        "CREATE TRIGGER node_resource_slots_inventory_version AFTER INSERT OR DELETE OR TRUNCATE "
        f"OR UPDATE OF {', '.join(SLOT_INVENTORY_COLUMNS)} ON node_resource_slots "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )


def downgrade() -> None:
    for table in (*WHOLE_TABLES, "node_resource_slots"):
        op.execute(f"DROP TRIGGER IF EXISTS {table}_inventory_version ON {table}")
    op.execute("DROP FUNCTION IF EXISTS bump_inventory_version()")
    op.drop_index("ix_node_resource_slots_unavailable", table_name="node_resource_slots")
    op.drop_table("inventory_version")
