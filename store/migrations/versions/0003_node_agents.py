"""node agents: liveness, the host each agent reported, and per-slot validation against it

`node_resource_slots` stays the operator's approved inventory, and the node agent validates each approved slot
against its real host (docs/seeds.md, "Approved slots, checked on the host"). PostgreSQL keeps both, per slot.
Agents report through the API with a node-scoped token (`api_tokens.node`); they hold no database credentials.

`node_agents` is a table of its own so that heartbeats never move `inventory_version`; only a change of an agent's
state (live <-> down) moves `liveness_version`, which control workers check on every decision. Slot validation is
inventory: the slots trigger now also fires on a change of `validation` or `validation_reason`.

Existing slots start `unvalidated`: a node is placed on again once its agent has reported.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OLD_SLOT_COLUMNS = (
    "node_id", "slot_index", "gpu_pci_address", "fabric_parent_pci_address", "fabric_vf_pci_address",
    "fabric_claim_mode", "nvme_device", "numa_node", "vcpus", "memory_mib", "mac_address", "private_ip", "approved",
)
SLOT_COLUMNS = (*OLD_SLOT_COLUMNS, "validation", "validation_reason")


def _slot_trigger(columns: tuple[str, ...]) -> None:
    op.execute("DROP TRIGGER IF EXISTS node_resource_slots_inventory_version ON node_resource_slots")
    op.execute(
        "CREATE TRIGGER node_resource_slots_inventory_version AFTER INSERT OR DELETE OR TRUNCATE "
        f"OR UPDATE OF {', '.join(columns)} ON node_resource_slots "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()"
    )


def upgrade() -> None:
    op.add_column(
        "node_resource_slots",
        sa.Column("validation", sa.String(16), nullable=False, server_default="unvalidated"),
    )
    op.add_column("node_resource_slots", sa.Column("validation_reason", sa.String(32)))
    op.add_column("node_resource_slots", sa.Column("validation_message", sa.Text()))
    op.add_column("node_resource_slots", sa.Column("validated_at", sa.DateTime(timezone=True)))
    op.create_check_constraint(
        op.f("ck_node_resource_slots_validation"), "node_resource_slots", "validation IN ('valid', 'raw_only', 'invalid', 'unvalidated')"
    )
    _slot_trigger(SLOT_COLUMNS)

    op.create_table(
        "node_agents",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("down_at", sa.DateTime(timezone=True)),
        sa.Column("down_reason", sa.Text()),
        sa.Column("interval_seconds", sa.Float(), nullable=False),
        sa.Column("agent_version", sa.String(64)),
        sa.Column("topology", sa.String(16)),
        sa.Column("host", postgresql.JSONB()),
        sa.Column("host_reported_at", sa.DateTime(timezone=True)),
        sa.Column("slices_blocked", sa.Text()),
        sa.Column("approved", sa.String(16)),
        sa.Column("approved_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("state IN ('live', 'down')", name=op.f("ck_node_agents_state")),
        sa.ForeignKeyConstraint(["node"], ["nodes.name"], name=op.f("fk_node_agents_node_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_agents")),
    )
    op.create_index(
        "ix_node_agents_live_expiry", "node_agents", ["expires_at"], postgresql_where=sa.text("state = 'live'")
    )
    op.create_index("ix_node_agents_approved_at", "node_agents", ["approved_at"])

    op.create_table(
        "liveness_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_liveness_version_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_liveness_version")),
    )
    op.execute("INSERT INTO liveness_version (id, version) VALUES (1, 1)")
    op.execute(
        """
        CREATE FUNCTION bump_liveness_version() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE liveness_version SET version = version + 1 WHERE id = 1;
            RETURN NULL;
        END $$
        """
    )
    # Row-level with WHEN: a heartbeat batch that sets state = 'live' on rows already live moves nothing.
    op.execute(
        "CREATE TRIGGER node_agents_state_changed AFTER UPDATE OF state ON node_agents FOR EACH ROW "
        "WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION bump_liveness_version()"
    )
    op.execute(
        "CREATE TRIGGER node_agents_added_or_removed AFTER INSERT OR DELETE OR TRUNCATE ON node_agents "
        "FOR EACH STATEMENT EXECUTE FUNCTION bump_liveness_version()"
    )

    op.add_column("api_tokens", sa.Column("node", sa.String(253)))
    op.create_foreign_key(
        op.f("fk_api_tokens_node_nodes"), "api_tokens", "nodes", ["node"], ["name"], ondelete="CASCADE"
    )
    op.drop_constraint(op.f("ck_api_tokens_role_tenant"), "api_tokens", type_="check")
    op.create_check_constraint(op.f("ck_api_tokens_role_tenant"), "api_tokens", "(role = 'tenant') = (tenant IS NOT NULL)")
    op.create_check_constraint(op.f("ck_api_tokens_role_node"), "api_tokens", "(role = 'node') = (node IS NOT NULL)")
    op.create_check_constraint(op.f("ck_api_tokens_role"), "api_tokens", "role IN ('admin', 'tenant', 'node')")


def downgrade() -> None:
    op.execute("DELETE FROM api_tokens WHERE role = 'node'")
    op.drop_constraint(op.f("ck_api_tokens_role"), "api_tokens", type_="check")
    op.drop_constraint(op.f("ck_api_tokens_role_node"), "api_tokens", type_="check")
    op.drop_constraint(op.f("ck_api_tokens_role_tenant"), "api_tokens", type_="check")
    op.create_check_constraint(op.f("ck_api_tokens_role_tenant"), "api_tokens", "(role = 'admin') = (tenant IS NULL)")
    op.drop_constraint(op.f("fk_api_tokens_node_nodes"), "api_tokens", type_="foreignkey")
    op.drop_column("api_tokens", "node")
    op.drop_table("node_agents")
    op.execute("DROP FUNCTION IF EXISTS bump_liveness_version()")
    op.drop_table("liveness_version")
    _slot_trigger(OLD_SLOT_COLUMNS)
    op.drop_constraint(op.f("ck_node_resource_slots_validation"), "node_resource_slots", type_="check")
    for column in ("validated_at", "validation_message", "validation_reason", "validation"):
        op.drop_column("node_resource_slots", column)
