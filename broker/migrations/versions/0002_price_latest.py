"""Latest point per price series in its own table; two fewer indexes on price_points.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Why: dedup on ingest needs the latest point of every series in a batch. One
indexed lookup per series cost more than the insert itself; a small
price_latest table (one row per series, upserted with the batch) answers it in
one query, and also serves last_seen(). With that, price_points keeps only the
two indexes its readers need (gpu+time, series+time), which makes bulk ingest
faster. The table is filled from existing history on upgrade.
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('price_latest',
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('market', sa.String(length=16), nullable=False),
    sa.Column('sku', sa.String(length=128), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('stat', sa.String(length=16), nullable=False),
    sa.Column('gpu', sa.String(length=64), server_default='', nullable=False),
    sa.Column('usd_per_hour', sa.Float(), nullable=False),
    sa.Column('count', sa.Integer(), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('provider', 'market', 'sku', 'region', 'zone', 'stat')
    )
    op.create_index('ix_price_latest_provider_region', 'price_latest', ['provider', 'region'], unique=False)
    # Backfill: the newest row of each series (ties broken by id).
    op.execute(
        """
        INSERT INTO price_latest (provider, market, sku, region, zone, stat, gpu, usd_per_hour, count, at)
        SELECT provider, market, sku, region, zone, stat, gpu, usd_per_hour, count, at
        FROM (
            SELECT p.*, ROW_NUMBER() OVER (
                PARTITION BY provider, market, sku, region, zone, stat ORDER BY at DESC, id DESC
            ) AS rn
            FROM price_points p
        ) ranked
        WHERE rn = 1
        """
    )
    op.drop_index('ix_price_points_provider_region_at', table_name='price_points')
    op.drop_index('ix_price_points_at', table_name='price_points')


def downgrade() -> None:
    op.create_index('ix_price_points_at', 'price_points', ['at'], unique=False)
    op.create_index('ix_price_points_provider_region_at', 'price_points', ['provider', 'region', 'at'], unique=False)
    op.drop_index('ix_price_latest_provider_region', table_name='price_latest')
    op.drop_table('price_latest')
