"""namespaced ModelDeployments, stored ModelCaches, and a pool's maxNodeCount

Three things the deployment API and its planning activity need that `berth plan` already
had from the files:

- ModelDeployments are namespaced (Modelplane's kind is): the same name in two namespaces is two deployments, so
  `model_deployments`, `model_replicas` and `replica_pool_usage` are keyed by (namespace, name). Existing rows take
  the namespace `default`, which is where every deployment lived before.
- `model_caches`: ModelCache documents applied with the fleet (`berth apply`, `PUT /v1/fleet`), read by the
  planning activity for a deployment's `modelCacheRef`.
- `pools.max_node_count`: an autoscaling Kubernetes pool counts maxNodeCount nodes when no status publishes a
  count, as `berth plan` does (scheduler/deployment/planning.py); the ledger counts the same.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

NAMESPACED = ("model_deployments", "model_replicas", "replica_pool_usage")


def upgrade() -> None:
    for table in NAMESPACED:
        op.add_column(table, sa.Column("namespace", sa.String(253), server_default="default", nullable=False))
    # The foreign keys into the old single-column keys go first, then the keys themselves.
    op.drop_constraint("fk_replica_pool_usage_replica_model_replicas", "replica_pool_usage", type_="foreignkey")
    op.drop_constraint("fk_model_replicas_deployment_model_deployments", "model_replicas", type_="foreignkey")
    op.drop_constraint("uq_replica_pool_usage_replica_engine", "replica_pool_usage", type_="unique")
    op.drop_constraint("uq_model_replicas_deployment_cluster_replica_index", "model_replicas", type_="unique")
    op.drop_constraint("pk_model_replicas", "model_replicas", type_="primary")
    op.drop_constraint("pk_model_deployments", "model_deployments", type_="primary")
    op.create_primary_key("pk_model_deployments", "model_deployments", ["namespace", "name"])
    op.create_primary_key("pk_model_replicas", "model_replicas", ["namespace", "name"])
    op.create_unique_constraint(
        "uq_model_replicas_namespace_deployment_cluster_replica_index",
        "model_replicas",
        ["namespace", "deployment", "cluster", "replica_index"],
    )
    op.create_unique_constraint(
        "uq_replica_pool_usage_namespace_replica_engine", "replica_pool_usage", ["namespace", "replica", "engine"]
    )
    op.create_foreign_key(
        "fk_model_replicas_namespace_model_deployments", "model_replicas", "model_deployments",
        ["namespace", "deployment"], ["namespace", "name"], ondelete="CASCADE",
    )
    op.create_foreign_key(
        "fk_replica_pool_usage_namespace_model_replicas", "replica_pool_usage", "model_replicas",
        ["namespace", "replica"], ["namespace", "name"], ondelete="CASCADE",
    )

    op.create_table(
        "model_caches",
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("api_version", sa.String(64), nullable=False),
        sa.Column("spec", postgresql.JSONB(), nullable=False),
        sa.Column("status", postgresql.JSONB()),
        sa.PrimaryKeyConstraint("namespace", "name", name=op.f("pk_model_caches")),
    )

    op.add_column("pools", sa.Column("max_node_count", sa.Integer()))
    op.create_check_constraint(
        "ck_pools_max_node_count", "pools", "max_node_count IS NULL OR max_node_count >= 1"
    )


def downgrade() -> None:
    op.drop_constraint("ck_pools_max_node_count", "pools", type_="check")
    op.drop_column("pools", "max_node_count")
    op.drop_table("model_caches")
    # Deployments outside `default` have no place in the old schema.
    op.execute("DELETE FROM model_deployments WHERE namespace <> 'default'")
    op.drop_constraint("fk_replica_pool_usage_namespace_model_replicas", "replica_pool_usage", type_="foreignkey")
    op.drop_constraint("fk_model_replicas_namespace_model_deployments", "model_replicas", type_="foreignkey")
    op.drop_constraint("uq_replica_pool_usage_namespace_replica_engine", "replica_pool_usage", type_="unique")
    op.drop_constraint(
        "uq_model_replicas_namespace_deployment_cluster_replica_index", "model_replicas", type_="unique"
    )
    op.drop_constraint("pk_model_replicas", "model_replicas", type_="primary")
    op.drop_constraint("pk_model_deployments", "model_deployments", type_="primary")
    op.create_primary_key("pk_model_deployments", "model_deployments", ["name"])
    op.create_primary_key("pk_model_replicas", "model_replicas", ["name"])
    op.create_unique_constraint(
        "uq_model_replicas_deployment_cluster_replica_index", "model_replicas", ["deployment", "cluster", "replica_index"]
    )
    op.create_unique_constraint("uq_replica_pool_usage_replica_engine", "replica_pool_usage", ["replica", "engine"])
    op.create_foreign_key(
        "fk_model_replicas_deployment_model_deployments", "model_replicas", "model_deployments",
        ["deployment"], ["name"], ondelete="CASCADE",
    )
    op.create_foreign_key(
        "fk_replica_pool_usage_replica_model_replicas", "replica_pool_usage", "model_replicas",
        ["replica"], ["name"], ondelete="CASCADE",
    )
    for table in NAMESPACED:
        op.drop_column(table, "namespace")
