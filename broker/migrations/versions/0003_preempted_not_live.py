"""A preempted allocation is not live: a requeued job may take a new one.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

Why: after a spot preemption the provider has taken the capacity back; the
record stays (preemptions per zone feed the spot policy) but must not count as
the job's one live allocation, or the job could never be placed again.
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "state IN ('intent','pending','running','preempted','unknown')"
NEW = "state IN ('intent','pending','running','unknown')"


def _recreate(where: str) -> None:
    op.drop_index("uq_allocations_one_live_per_job", table_name="allocations")
    op.create_index("uq_allocations_one_live_per_job", "allocations", ["job_id"], unique=True,
                    sqlite_where=sa.text(where), postgresql_where=sa.text(where))


def upgrade() -> None:
    _recreate(NEW)


def downgrade() -> None:
    _recreate(OLD)
