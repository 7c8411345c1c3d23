"""Initial schema: jobs, events, allocations, prices, alerts, benchmarks, health, tenants, tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written by autogenerate against broker/tables.py, then reviewed: plain DateTime(timezone=True)
for timestamps (the UTC handling is Python-side), sa.false() defaults that work on both backends.
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('benchmarks',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=256), nullable=False),
    sa.Column('gpu', sa.String(length=64), server_default='', nullable=False),
    sa.Column('healthy', sa.Boolean(), nullable=False),
    sa.Column('measured_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_benchmarks_provider_target_at', 'benchmarks', ['provider', 'target', 'measured_at'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), server_default='', nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('placement', sa.JSON(), nullable=True),
    sa.Column('decision', sa.JSON(), nullable=True),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
    sa.Column('claimed_by', sa.String(length=128), nullable=True),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('preemptions', sa.Integer(), server_default='0', nullable=False),
    sa.Column('spent_usd', sa.Float(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_jobs_claimed_by', 'jobs', ['claimed_by'], unique=False)
    op.create_index('ix_jobs_created_at', 'jobs', ['created_at'], unique=False)
    op.create_index('ix_jobs_deadline', 'jobs', ['deadline'], unique=False)
    op.create_index('ix_jobs_state_created', 'jobs', ['state', 'created_at'], unique=False)
    op.create_index('ix_jobs_tenant_created', 'jobs', ['tenant', 'created_at', 'id'], unique=False)
    op.create_index('ix_jobs_updated_at', 'jobs', ['updated_at'], unique=False)

    op.create_table('node_health',
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=256), nullable=False),
    sa.Column('healthy', sa.Boolean(), nullable=False),
    sa.Column('reason', sa.Text(), server_default='', nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('provider', 'node')
    )
    op.create_index('ix_node_health_healthy', 'node_health', ['healthy'], unique=False)

    op.create_table('price_points',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('market', sa.String(length=16), nullable=False),
    sa.Column('sku', sa.String(length=128), nullable=False),
    sa.Column('gpu', sa.String(length=64), server_default='', nullable=False),
    sa.Column('region', sa.String(length=64), server_default='', nullable=False),
    sa.Column('zone', sa.String(length=64), server_default='', nullable=False),
    sa.Column('stat', sa.String(length=16), server_default='price', nullable=False),
    sa.Column('usd_per_hour', sa.Float(), nullable=False),
    sa.Column('count', sa.Integer(), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_price_points_at', 'price_points', ['at'], unique=False)
    op.create_index('ix_price_points_gpu_at', 'price_points', ['gpu', 'at'], unique=False)
    op.create_index('ix_price_points_provider_region_at', 'price_points', ['provider', 'region', 'at'], unique=False)
    op.create_index('ix_price_points_series_at', 'price_points', ['provider', 'market', 'sku', 'region', 'zone', 'stat', 'at'], unique=False)

    op.create_table('spike_alerts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('series', sa.JSON(), nullable=False),
    sa.Column('start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('end', sa.DateTime(timezone=True), nullable=True),
    sa.Column('peak', sa.Float(), nullable=False),
    sa.Column('baseline', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_spike_alerts_end', 'spike_alerts', ['end'], unique=False)
    op.create_index('ix_spike_alerts_start', 'spike_alerts', ['start'], unique=False)

    op.create_table('tenants',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('monthly_budget_usd', sa.Float(), nullable=True),
    sa.Column('max_gpus', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('allocations',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), server_default='0', nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('offer_id', sa.String(length=256), server_default='', nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('client_token', sa.String(length=128), server_default='', nullable=False),
    sa.Column('resource_ids', sa.JSON(), nullable=True),
    sa.Column('nodes', sa.Integer(), server_default='1', nullable=False),
    sa.Column('region', sa.String(length=64), server_default='', nullable=False),
    sa.Column('zone', sa.String(length=64), server_default='', nullable=False),
    sa.Column('usd_per_hour', sa.Float(), server_default='0', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('reason', sa.Text(), server_default='', nullable=False),
    sa.Column('attrs', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_allocations_job_id', 'allocations', ['job_id'], unique=False)
    op.create_index('ix_allocations_provider', 'allocations', ['provider'], unique=False)
    op.create_index('ix_allocations_state', 'allocations', ['state'], unique=False)
    op.create_index('uq_allocations_one_live_per_job', 'allocations', ['job_id'], unique=True, sqlite_where=sa.text("state IN ('intent','pending','running','preempted','unknown')"), postgresql_where=sa.text("state IN ('intent','pending','running','preempted','unknown')"))

    op.create_table('idempotency_keys',
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('key', sa.String(length=256), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant', 'key')
    )
    op.create_table('job_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('from_state', sa.String(length=16), nullable=True),
    sa.Column('to_state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), server_default='', nullable=False),
    sa.Column('data', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_job_events_job_id', 'job_events', ['job_id', 'id'], unique=False)

    op.create_table('tokens',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('label', sa.String(length=256), server_default='', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.ForeignKeyConstraint(['tenant'], ['tenants.name'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_index('ix_tokens_tenant', 'tokens', ['tenant'], unique=False)



def downgrade() -> None:
    op.drop_index('ix_tokens_tenant', table_name='tokens')

    op.drop_table('tokens')
    op.drop_index('ix_job_events_job_id', table_name='job_events')

    op.drop_table('job_events')
    op.drop_table('idempotency_keys')
    op.drop_index('uq_allocations_one_live_per_job', table_name='allocations', sqlite_where=sa.text("state IN ('intent','pending','running','preempted','unknown')"), postgresql_where=sa.text("state IN ('intent','pending','running','preempted','unknown')"))
    op.drop_index('ix_allocations_state', table_name='allocations')
    op.drop_index('ix_allocations_provider', table_name='allocations')
    op.drop_index('ix_allocations_job_id', table_name='allocations')

    op.drop_table('allocations')
    op.drop_table('tenants')
    op.drop_index('ix_spike_alerts_start', table_name='spike_alerts')
    op.drop_index('ix_spike_alerts_end', table_name='spike_alerts')

    op.drop_table('spike_alerts')
    op.drop_index('ix_price_points_series_at', table_name='price_points')
    op.drop_index('ix_price_points_provider_region_at', table_name='price_points')
    op.drop_index('ix_price_points_gpu_at', table_name='price_points')
    op.drop_index('ix_price_points_at', table_name='price_points')

    op.drop_table('price_points')
    op.drop_index('ix_node_health_healthy', table_name='node_health')

    op.drop_table('node_health')
    op.drop_index('ix_jobs_updated_at', table_name='jobs')
    op.drop_index('ix_jobs_tenant_created', table_name='jobs')
    op.drop_index('ix_jobs_state_created', table_name='jobs')
    op.drop_index('ix_jobs_deadline', table_name='jobs')
    op.drop_index('ix_jobs_created_at', table_name='jobs')
    op.drop_index('ix_jobs_claimed_by', table_name='jobs')

    op.drop_table('jobs')
    op.drop_index('ix_benchmarks_provider_target_at', table_name='benchmarks')

    op.drop_table('benchmarks')
