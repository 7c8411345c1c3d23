"""Each allocation's cost, booked once when it ends; the last of each node's log, kept in the store.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Why: a job's spend was a figure the lifecycle wrote into the job at each end, and a tenant's month-to-date
spend summed the jobs updated this month, so a job updated this month counted all it ever cost, and a
crash between the machine's release and that write lost the attempt's cost. Now an allocation's cost
(price × billed time, per its market's granularity) is written on the allocation and added to its job in one
transaction, only while the allocation has none (``cost_usd IS NULL``): booking twice is impossible and a
booking a crash interrupted is done by the next release of the same record. Month-to-date spend is read from
the allocations (``ended_at``), so it counts what ended this month plus what live ones have accrued.

``job_logs`` keeps the last of each node's log when its allocation ends: on Vast the log goes with the
instance; on AWS the bucket's objects expire. Secret values are masked before it is written.

Existing rows: every ended allocation gets ``ended_at`` = its last update and a cost of 0, except each job's
newest ended allocation, which takes the job's ``spent_usd`` (so a job's allocations still add up to it).
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = ("intent", "pending", "running", "unknown")


def upgrade() -> None:
    op.add_column("allocations", sa.Column("cost_usd", sa.Float(), nullable=True))
    op.add_column("allocations", sa.Column("billed_s", sa.Float(), nullable=True))
    op.add_column("allocations", sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_allocations_ended_at", "allocations", ["ended_at"], unique=False)
    op.create_table(
        "job_logs",
        sa.Column("allocation_id", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("truncated", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["allocation_id"], ["allocations.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("allocation_id", "rank"),
    )
    op.create_index("ix_job_logs_job_id", "job_logs", ["job_id"], unique=False)

    live = ", ".join(f"'{s}'" for s in LIVE)
    op.execute(f"UPDATE allocations SET ended_at = updated_at, cost_usd = 0, billed_s = 0 WHERE state NOT IN ({live})")
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        f"SELECT a.id, a.job_id, j.spent_usd FROM allocations a JOIN jobs j ON j.id = a.job_id "
        f"WHERE j.spent_usd > 0 AND a.state NOT IN ({live}) ORDER BY a.job_id, a.updated_at, a.id")).all()
    newest: dict[str, tuple[str, float]] = {}
    for alloc_id, job_id, spent in rows:
        newest[job_id] = (alloc_id, float(spent))
    for alloc_id, spent in newest.values():
        bind.execute(sa.text("UPDATE allocations SET cost_usd = :c WHERE id = :i"), {"c": spent, "i": alloc_id})


def downgrade() -> None:
    op.drop_index("ix_job_logs_job_id", table_name="job_logs")
    op.drop_table("job_logs")
    op.drop_index("ix_allocations_ended_at", table_name="allocations")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("ended_at")
        batch.drop_column("billed_s")
        batch.drop_column("cost_usd")
