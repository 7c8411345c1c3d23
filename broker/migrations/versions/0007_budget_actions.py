"""What a tenant's running jobs do once its monthly budget is spent, and the budget alert last sent.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Why (issue 24): a budget held only at placement; a running job could pass it by any amount and nothing
warned. Every poll now weighs each tenant's month-to-date spend, what its live allocations accrue and what its
running jobs are expected to cost yet against its budget: alerts at 50/80/100% (``budget_alert`` keeps the
last one sent, "YYYY-MM:percent", so each is sent once a month) and, at 100%, ``on_budget_exhausted``
(``stop``, ``signal_then_stop`` — the default — or ``continue``).

Existing tenants get the default; no alert has been sent.
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("on_budget_exhausted", sa.String(length=32), nullable=False,
                                       server_default="signal_then_stop"))
    op.add_column("tenants", sa.Column("budget_alert", sa.String(length=32), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("budget_alert")
        batch.drop_column("on_budget_exhausted")
