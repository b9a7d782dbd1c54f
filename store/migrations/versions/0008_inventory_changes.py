"""inventory changes: a per-node log, so a control worker re-reads only the nodes that changed

Until now every inventory write moved `inventory_version`, and each control worker and API process then re-read the
whole inventory (1.3-2.0 s at 10,000 nodes) for a cordon or one agent's report. Writes that touch one node now add
a row naming that node to `inventory_changes` instead; `inventory_version` still moves for what changes the fleet's
shape (regions, classes, clusters, pools, tenants; a node added, removed or moved to another pool; TRUNCATE).

What is logged, and how cheaply:
- `nodes` UPDATE: a row trigger, only for rows that really changed (WHEN OLD.* IS DISTINCT FROM NEW.*).
- `node_resource_slots` UPDATE: a row trigger on the fleet's and the validation's columns only, and only for real
  changes. Claims, releases and quarantines set `state` alone, so this trigger never fires on the allocation path
  (a column list is checked against the statement's SET list before any row is looked at).
- `node_resource_slots` and `node_agents` INSERT and DELETE: statement triggers over the transition tables, one
  INSERT ... SELECT DISTINCT per statement however many rows it wrote.
- `node_agents` UPDATE of `state` when it really changes (live <-> down), as `liveness_version` does: heartbeats
  that leave an agent live log nothing.

Readers keep a position in transaction ids, not in `seq`: a sequence value is taken at insert, so a later `seq` can
commit before an earlier one. Each row carries its writer's transaction id (`txid`); a reader that has seen every
row below its last snapshot's xmin asks only for rows with `txid >= xmin` (an index range scan, normally empty).
`inventory_changes_pruned.through` is the highest `txid` pruned: a reader whose position is not above it may have
missed rows and reads the inventory whole.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SLOT_COLUMNS = (
    "node_id", "slot_index", "gpu_pci_address", "fabric_parent_pci_address", "fabric_vf_pci_address",
    "fabric_claim_mode", "nvme_device", "numa_node", "vcpus", "memory_mib", "mac_address", "private_ip", "approved",
    "validation", "validation_reason",
)
_SLOT_ROW = ", ".join(f"{{0}}.{column}" for column in SLOT_COLUMNS)

ROW_FUNCTION = """
CREATE FUNCTION log_inventory_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'nodes' THEN
        IF OLD.name <> NEW.name OR OLD.pool_id <> NEW.pool_id THEN
            UPDATE inventory_version SET version = version + 1 WHERE id = 1;  -- pool membership: a fleet change
        ELSE
            INSERT INTO inventory_changes (node) VALUES (NEW.name);
        END IF;
    ELSIF TG_TABLE_NAME = 'node_agents' THEN
        INSERT INTO inventory_changes (node) VALUES (NEW.node);
    ELSE
        INSERT INTO inventory_changes (node) VALUES (NEW.node_id);
        IF OLD.node_id <> NEW.node_id THEN
            INSERT INTO inventory_changes (node) VALUES (OLD.node_id);
        END IF;
    END IF;
    RETURN NULL;
END $$
"""

STATEMENT_FUNCTION = """
CREATE FUNCTION log_inventory_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'node_agents' THEN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO inventory_changes (node) SELECT DISTINCT node FROM new_rows;
        ELSE
            INSERT INTO inventory_changes (node) SELECT DISTINCT node FROM old_rows;
        END IF;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO inventory_changes (node) SELECT DISTINCT node_id FROM new_rows;
    ELSE
        INSERT INTO inventory_changes (node) SELECT DISTINCT node_id FROM old_rows;
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "inventory_changes",
        sa.Column("seq", sa.BigInteger(), autoincrement=True, nullable=False),  # bigserial
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column(
            "txid",
            sa.BigInteger(),
            nullable=False,
            server_default=sa.text("CAST(CAST(pg_current_xact_id() AS text) AS bigint)"),
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_inventory_changes")),
    )
    op.create_index("ix_inventory_changes_txid", "inventory_changes", ["txid"])
    op.create_index("ix_inventory_changes_at", "inventory_changes", ["at"])
    op.create_table(
        "inventory_changes_pruned",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("through", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_inventory_changes_pruned_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inventory_changes_pruned")),
    )
    op.execute("INSERT INTO inventory_changes_pruned (id, through) VALUES (1, 0)")
    op.execute(ROW_FUNCTION)
    op.execute(STATEMENT_FUNCTION)

    # nodes: added, removed or truncated is still a fleet change; an update is one node's change.
    op.execute("DROP TRIGGER nodes_inventory_version ON nodes")
    op.execute(
        "CREATE TRIGGER nodes_inventory_version AFTER INSERT OR DELETE OR TRUNCATE ON nodes "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )
    op.execute(
        "CREATE TRIGGER nodes_inventory_changes AFTER UPDATE ON nodes FOR EACH ROW "
        "WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION log_inventory_row()"
    )

    op.execute("DROP TRIGGER node_resource_slots_inventory_version ON node_resource_slots")
    op.execute(
        "CREATE TRIGGER node_resource_slots_inventory_version AFTER TRUNCATE ON node_resource_slots "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )
    op.execute(
        f"CREATE TRIGGER node_resource_slots_changed AFTER UPDATE OF {', '.join(SLOT_COLUMNS)} ON node_resource_slots "
        f"FOR EACH ROW WHEN (({_SLOT_ROW.format('OLD')}) IS DISTINCT FROM ({_SLOT_ROW.format('NEW')})) "
        "EXECUTE FUNCTION log_inventory_row()"
    )
    for table in ("node_resource_slots", "node_agents"):
        op.execute(
            f"CREATE TRIGGER {table}_added AFTER INSERT ON {table} REFERENCING NEW TABLE AS new_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION log_inventory_rows()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_removed AFTER DELETE ON {table} REFERENCING OLD TABLE AS old_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION log_inventory_rows()"
        )
    op.execute(
        "CREATE TRIGGER node_agents_state_logged AFTER UPDATE OF state ON node_agents FOR EACH ROW "
        "WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION log_inventory_row()"
    )
    op.execute(
        "CREATE TRIGGER node_agents_truncated AFTER TRUNCATE ON node_agents "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )


def downgrade() -> None:
    for trigger, table in (
        ("node_agents_truncated", "node_agents"),
        ("node_agents_state_logged", "node_agents"),
        ("node_agents_added", "node_agents"),
        ("node_agents_removed", "node_agents"),
        ("node_resource_slots_added", "node_resource_slots"),
        ("node_resource_slots_removed", "node_resource_slots"),
        ("node_resource_slots_changed", "node_resource_slots"),
        ("node_resource_slots_inventory_version", "node_resource_slots"),
        ("nodes_inventory_changes", "nodes"),
        ("nodes_inventory_version", "nodes"),
    ):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
    # As migrations 0002 and 0003 left them: every write moves the version.
    op.execute(
        "CREATE TRIGGER nodes_inventory_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON nodes "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )
    op.execute(
        "CREATE TRIGGER node_resource_slots_inventory_version AFTER INSERT OR DELETE OR TRUNCATE "
        f"OR UPDATE OF {', '.join(SLOT_COLUMNS)} ON node_resource_slots "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )
    op.execute("DROP FUNCTION IF EXISTS log_inventory_rows()")
    op.execute("DROP FUNCTION IF EXISTS log_inventory_row()")
    op.drop_table("inventory_changes_pruned")
    op.drop_table("inventory_changes")
