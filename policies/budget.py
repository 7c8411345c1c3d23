"""Budgets while jobs run: where a tenant stands against its monthly budget, and which alert is due. Pure:
the broker (broker/budgets.py) reads the figures and acts; the month and every amount are arguments.

A tenant's standing weighs what it has spent this UTC month (booked, plus what its live allocations have
accrued) and what its running jobs are expected to cost yet (``committed``: each one's expected cost at
placement less what it has cost so far). Alerts go at 50, 80 and 100% of the budget on the *projected* figure
(spent + committed): a warning before the money is gone. New placements stop at 100% projected; running jobs
are stopped (per the tenant's ``on_budget_exhausted``) only once what is *spent* reaches the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

THRESHOLDS = (50, 80, 100)  # percent of the monthly budget


@dataclass(frozen=True)
class Standing:
    """A tenant against its monthly budget at one moment (USD)."""

    tenant: str
    budget_usd: float
    spent_usd: float  # this month: booked plus accruing
    committed_usd: float  # its running jobs' expected remaining cost

    @property
    def projected_usd(self) -> float:
        return self.spent_usd + self.committed_usd

    @property
    def ratio(self) -> float:
        """Projected spend over the budget (a zero budget with anything projected: infinite)."""
        if self.budget_usd > 0:
            return self.projected_usd / self.budget_usd
        return float("inf") if self.projected_usd > 0 else 0.0

    @property
    def level(self) -> int:
        """The highest alert threshold (percent) the projected spend has reached, 0 below the first."""
        return max((t for t in THRESHOLDS if self.ratio * 100 >= t - 1e-9), default=0)

    @property
    def exhausted(self) -> bool:
        """Spent (not merely projected) reaches the budget: running jobs are stopped per the tenant's rule."""
        return self.spent_usd >= self.budget_usd


def alert_due(last: str, month: str, level: int) -> bool:
    """Is an alert at ``level`` due, given the last one sent (``"YYYY-MM:percent"``, '' for none)? Each level
    is sent once a month (UTC); a new month starts over."""
    if level <= 0:
        return False
    sent_month, _, pct = last.partition(":")
    return sent_month != month or int(pct or 0) < level


def remaining(expected_usd: float | None, spent_usd: float) -> float:
    """What a running job is expected to cost yet: its expected cost at placement less what it has cost."""
    return max((expected_usd or 0.0) - spent_usd, 0.0)


def over_cap(max_cost_usd: float | None, spent_usd: float) -> bool:
    """Has a job reached its own cap (``max_cost_usd``)?"""
    return max_cost_usd is not None and spent_usd >= max_cost_usd
