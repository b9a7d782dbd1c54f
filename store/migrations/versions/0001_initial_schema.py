"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 03:04:05.545460
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('inference_classes',
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('api_version', sa.String(length=64), nullable=False),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_inference_classes'))
    )
    op.create_table('model_deployments',
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('replicas', sa.Integer(), nullable=False),
    sa.Column('status', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('replicas >= 0', name=op.f('ck_model_deployments_replicas')),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_model_deployments'))
    )
    op.create_table('regions',
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('jurisdiction', sa.String(length=64), nullable=True),
    sa.Column('prices', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('labels', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.CheckConstraint("status IN ('available', 'degraded', 'unavailable')", name=op.f('ck_regions_status')),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_regions'))
    )
    op.create_table('tenants',
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('gpu_quota', sa.Integer(), nullable=False),
    sa.Column('allowed_regions', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('required_jurisdiction', sa.String(length=64), nullable=True),
    sa.CheckConstraint('gpu_quota >= 0', name=op.f('ck_tenants_gpu_quota')),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_tenants'))
    )
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('token_sha256', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('tenant', sa.String(length=253), nullable=True),
    sa.Column('label', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("(role = 'admin') = (tenant IS NULL)", name=op.f('ck_api_tokens_role_tenant')),
    sa.ForeignKeyConstraint(['tenant'], ['tenants.name'], name=op.f('fk_api_tokens_tenant_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_sha256', name=op.f('uq_api_tokens_token_sha256'))
    )
    op.create_table('clusters',
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('api_version', sa.String(length=64), nullable=False),
    sa.Column('region', sa.String(length=253), nullable=True),
    sa.Column('labels', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('taints', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('status', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.ForeignKeyConstraint(['region'], ['regions.name'], name=op.f('fk_clusters_region_regions'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_clusters'))
    )
    op.create_table('model_replicas',
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('deployment', sa.String(length=253), nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=False),
    sa.Column('replica_index', sa.Integer(), nullable=False),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('state', sa.String(length=32), server_default='pending', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('replica_index >= 0', name=op.f('ck_model_replicas_replica_index')),
    sa.ForeignKeyConstraint(['cluster'], ['clusters.name'], name=op.f('fk_model_replicas_cluster_clusters'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['deployment'], ['model_deployments.name'], name=op.f('fk_model_replicas_deployment_model_deployments'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_model_replicas')),
    sa.UniqueConstraint('deployment', 'cluster', 'replica_index', name=op.f('uq_model_replicas_deployment_cluster_replica_index'))
    )
    op.create_table('pools',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=False),
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('class_name', sa.String(length=253), nullable=False),
    sa.Column('shape', sa.String(length=16), nullable=False),
    sa.Column('gpu_product', sa.String(length=64), nullable=True),
    sa.Column('node_count', sa.Integer(), nullable=False),
    sa.Column('node_template', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.CheckConstraint("shape = 'kubernetes' OR gpu_product IS NOT NULL", name=op.f('ck_pools_gpu_product')),
    sa.CheckConstraint("shape IN ('gpu_slice', 'baremetal', 'kubernetes')", name=op.f('ck_pools_shape')),
    sa.CheckConstraint('node_count >= 0', name=op.f('ck_pools_node_count')),
    sa.ForeignKeyConstraint(['class_name'], ['inference_classes.name'], name=op.f('fk_pools_class_name_inference_classes'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['cluster'], ['clusters.name'], name=op.f('fk_pools_cluster_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pools')),
    sa.UniqueConstraint('cluster', 'name', name=op.f('uq_pools_cluster_name'))
    )
    op.create_table('allocations',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=253), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('shape', sa.String(length=16), nullable=False),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('gpu_product', sa.String(length=64), nullable=True),
    sa.Column('request', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('idempotency_key', sa.String(length=255), nullable=True),
    sa.Column('region', sa.String(length=253), nullable=True),
    sa.Column('pool_id', sa.Integer(), nullable=True),
    sa.Column('node_id', sa.String(length=253), nullable=True),
    sa.Column('workflow_id', sa.String(length=255), nullable=False),
    sa.Column('failure_reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("shape IN ('gpu_slice', 'baremetal')", name=op.f('ck_allocations_shape')),
    sa.CheckConstraint("state IN ('pending', 'placing', 'planning', 'claiming', 'provisioning', 'waiting_ready', 'active', 'releasing', 'released', 'failed', 'cancelled')", name=op.f('ck_allocations_state')),
    sa.CheckConstraint('gpu_count > 0', name=op.f('ck_allocations_gpu_count')),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_allocations_pool_id_pools'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant'], ['tenants.name'], name=op.f('fk_allocations_tenant_tenants'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_allocations')),
    sa.UniqueConstraint('tenant', 'idempotency_key', name=op.f('uq_allocations_tenant_idempotency_key'))
    )
    op.create_index(op.f('ix_allocations_state'), 'allocations', ['state'], unique=False)
    op.create_index(op.f('ix_allocations_tenant'), 'allocations', ['tenant'], unique=False)
    op.create_table('nodes',
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('pool_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('declared_status', sa.String(length=16), nullable=False),
    sa.Column('labels', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('cpus', sa.Integer(), nullable=False),
    sa.Column('memory_mib', sa.BigInteger(), nullable=False),
    sa.Column('numa_nodes', sa.Integer(), nullable=False),
    sa.Column('simulation', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.CheckConstraint("status IN ('READY', 'CORDONED', 'DRAINING', 'DOWN')", name=op.f('ck_nodes_status')),
    sa.CheckConstraint('cpus > 0 AND memory_mib > 0 AND numa_nodes > 0', name=op.f('ck_nodes_resources')),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_nodes_pool_id_pools'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_nodes'))
    )
    op.create_index(op.f('ix_nodes_pool_id'), 'nodes', ['pool_id'], unique=False)
    op.create_table('replica_pool_usage',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('replica', sa.String(length=253), nullable=False),
    sa.Column('engine', sa.String(length=253), nullable=False),
    sa.Column('pool_id', sa.Integer(), nullable=False),
    sa.Column('nodes', sa.Integer(), nullable=False),
    sa.CheckConstraint('nodes >= 0', name=op.f('ck_replica_pool_usage_nodes')),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_replica_pool_usage_pool_id_pools'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['replica'], ['model_replicas.name'], name=op.f('fk_replica_pool_usage_replica_model_replicas'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_replica_pool_usage')),
    sa.UniqueConstraint('replica', 'engine', name=op.f('uq_replica_pool_usage_replica_engine'))
    )
    op.create_index(op.f('ix_replica_pool_usage_pool_id'), 'replica_pool_usage', ['pool_id'], unique=False)
    op.create_table('allocation_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('allocation_id', sa.String(length=64), nullable=False),
    sa.Column('event_key', sa.String(length=255), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('step', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('node_id', sa.String(length=253), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['allocation_id'], ['allocations.id'], name=op.f('fk_allocation_events_allocation_id_allocations'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_allocation_events')),
    sa.UniqueConstraint('allocation_id', 'event_key', name=op.f('uq_allocation_events_allocation_id_event_key'))
    )
    op.create_index(op.f('ix_allocation_events_allocation_id'), 'allocation_events', ['allocation_id'], unique=False)
    op.create_table('node_resource_slots',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('node_id', sa.String(length=253), nullable=False),
    sa.Column('slot_index', sa.Integer(), nullable=False),
    sa.Column('gpu_pci_address', sa.String(length=16), nullable=False),
    sa.Column('fabric_parent_pci_address', sa.String(length=16), nullable=True),
    sa.Column('fabric_vf_pci_address', sa.String(length=16), nullable=True),
    sa.Column('fabric_claim_mode', sa.String(length=16), nullable=False),
    sa.Column('nvme_device', sa.Text(), nullable=True),
    sa.Column('numa_node', sa.Integer(), nullable=False),
    sa.Column('vcpus', sa.Integer(), nullable=False),
    sa.Column('memory_mib', sa.BigInteger(), nullable=False),
    sa.Column('mac_address', sa.String(length=17), nullable=True),
    sa.Column('private_ip', sa.String(length=45), nullable=True),
    sa.Column('approved', sa.Boolean(), nullable=False),
    sa.Column('state', sa.String(length=16), server_default='available', nullable=False),
    sa.Column('quarantine_reason', sa.Text(), nullable=True),
    sa.CheckConstraint("fabric_claim_mode IN ('per_slot_vf', 'shared_parent', 'none')", name=op.f('ck_node_resource_slots_fabric_claim_mode')),
    sa.CheckConstraint("state IN ('available', 'reserved', 'quarantined')", name=op.f('ck_node_resource_slots_state')),
    sa.CheckConstraint('slot_index >= 0 AND numa_node >= 0 AND vcpus > 0 AND memory_mib > 0', name=op.f('ck_node_resource_slots_resources')),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.name'], name=op.f('fk_node_resource_slots_node_id_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_node_resource_slots')),
    sa.UniqueConstraint('node_id', 'gpu_pci_address', name=op.f('uq_node_resource_slots_node_id_gpu_pci_address')),
    sa.UniqueConstraint('node_id', 'slot_index', name=op.f('uq_node_resource_slots_node_id_slot_index'))
    )
    op.create_index('uq_node_resource_slots_node_id_fabric_vf', 'node_resource_slots', ['node_id', 'fabric_vf_pci_address'], unique=True, postgresql_where=sa.text("fabric_vf_pci_address IS NOT NULL AND fabric_vf_pci_address <> ''"))
    op.create_table('allocation_resource_claims',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('allocation_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('slot_id', sa.Integer(), nullable=True),
    sa.Column('node_id', sa.String(length=253), nullable=False),
    sa.Column('bundle', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('claimed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('released_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint('attempt >= 1', name=op.f('ck_allocation_resource_claims_attempt')),
    sa.CheckConstraint('released_at IS NOT NULL OR slot_id IS NOT NULL', name=op.f('ck_allocation_resource_claims_active_has_slot')),
    sa.ForeignKeyConstraint(['allocation_id'], ['allocations.id'], name=op.f('fk_allocation_resource_claims_allocation_id_allocations'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['slot_id'], ['node_resource_slots.id'], name=op.f('fk_allocation_resource_claims_slot_id_node_resource_slots'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_allocation_resource_claims')),
    sa.UniqueConstraint('allocation_id', 'attempt', 'slot_id', name=op.f('uq_allocation_resource_claims_allocation_id_attempt_slot_id'))
    )
    op.create_index(op.f('ix_allocation_resource_claims_allocation_id'), 'allocation_resource_claims', ['allocation_id'], unique=False)
    op.create_index('uq_allocation_resource_claims_active_slot', 'allocation_resource_claims', ['slot_id'], unique=True, postgresql_where=sa.text('released_at IS NULL'))


def downgrade() -> None:
    op.drop_index('uq_allocation_resource_claims_active_slot', table_name='allocation_resource_claims', postgresql_where=sa.text('released_at IS NULL'))
    op.drop_index(op.f('ix_allocation_resource_claims_allocation_id'), table_name='allocation_resource_claims')
    op.drop_table('allocation_resource_claims')
    op.drop_index('uq_node_resource_slots_node_id_fabric_vf', table_name='node_resource_slots', postgresql_where=sa.text("fabric_vf_pci_address IS NOT NULL AND fabric_vf_pci_address <> ''"))
    op.drop_table('node_resource_slots')
    op.drop_index(op.f('ix_allocation_events_allocation_id'), table_name='allocation_events')
    op.drop_table('allocation_events')
    op.drop_index(op.f('ix_replica_pool_usage_pool_id'), table_name='replica_pool_usage')
    op.drop_table('replica_pool_usage')
    op.drop_index(op.f('ix_nodes_pool_id'), table_name='nodes')
    op.drop_table('nodes')
    op.drop_index(op.f('ix_allocations_tenant'), table_name='allocations')
    op.drop_index(op.f('ix_allocations_state'), table_name='allocations')
    op.drop_table('allocations')
    op.drop_table('pools')
    op.drop_table('model_replicas')
    op.drop_table('clusters')
    op.drop_table('api_tokens')
    op.drop_table('tenants')
    op.drop_table('regions')
    op.drop_table('model_deployments')
    op.drop_table('inference_classes')
