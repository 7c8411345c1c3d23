"""Prometheus metrics, one CollectorRegistry per application (several apps may share a process).

Counters and histograms are fed by hooks as things happen (HTTP requests,
quotes, provider refreshes, placement attempts); job, allocation, spend, budget
and price-spike figures are read from the store (``Lockstep.metrics_figures``) when /metrics is scraped, so
every replica reports the same truth; provider health and the last
reconciliation are this replica's own view.

deploy/grafana/lockstep.json and deploy/prometheus/alerts.yaml use these names;
tests/deploy/test_observability.py checks each of them against a real scrape.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from broker.models import JobState, as_utc
from broker.service.operations import circuit_code

if TYPE_CHECKING:
    from broker.service import Lockstep

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RefreshHook = Callable[[str, bool, float], None]  # Marketplace.on_refresh: (provider, ok, seconds)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter("lockstep_http_requests", "HTTP requests by route, method and status",
                                     ["route", "method", "status"], registry=r)
        self.http_seconds = Histogram("lockstep_http_request_seconds", "HTTP request latency by route",
                                      ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.quote_seconds = Histogram("lockstep_quote_seconds", "Time to rank offers for one quote",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.provider_refresh = Counter("lockstep_provider_refreshes",
                                        "Offer refreshes by provider and outcome", ["provider", "outcome"],
                                        registry=r)
        self.provider_errors = Counter("lockstep_provider_errors", "Failed offer refreshes by provider",
                                       ["provider"], registry=r)
        self.provider_seconds = Histogram("lockstep_provider_refresh_seconds", "Offer refresh latency",
                                          ["provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.jobs = Gauge("lockstep_jobs", "Jobs by state", ["state"], registry=r)
        self.placements = Gauge("lockstep_placements",
                                "Placements made (jobs sent to provisioning), all time", registry=r)
        self.allocations = Gauge("lockstep_allocations", "Allocations by provider and state",
                                 ["provider", "state"], registry=r)
        self.placement_attempts = Counter("lockstep_placement_attempts",
                                          "Launch attempts by provider and outcome (placed, capacity, quota, "
                                          "auth, ...), this replica", ["provider", "outcome"], registry=r)
        self.jobs_oldest = Gauge("lockstep_jobs_oldest_seconds",
                                 "Age of the longest-waiting job in each waiting state (since its last change)",
                                 ["state"], registry=r)
        self.provider_up = Gauge("lockstep_provider_up",
                                 "1 when the provider's last offer refresh succeeded and is not stale",
                                 ["provider"], registry=r)
        self.provider_offers = Gauge("lockstep_provider_offers", "Offers the provider has now", ["provider"],
                                     registry=r)
        self.provider_last_ok = Gauge("lockstep_provider_last_success_timestamp_seconds",
                                      "When the provider's offers last refreshed successfully (Unix time)",
                                      ["provider"], registry=r)
        self.circuit_state = Gauge("lockstep_provider_circuit_state",
                                   "The provider's circuit breaker: 0 closed, 1 half-open (probing), 2 open, "
                                   "3 credentials refused (unusable until its configuration changes)",
                                   ["provider"], registry=r)
        self.circuit_failures = Gauge("lockstep_provider_circuit_failures",
                                      "Consecutive failed calls (refresh, launch, poll) to the provider", ["provider"],
                                      registry=r)
        self.circuit_next_probe = Gauge("lockstep_provider_circuit_next_probe_timestamp_seconds",
                                        "When the provider's open circuit lets its next probe through (Unix time)",
                                        ["provider"], registry=r)
        self.tenant_spend = Gauge("lockstep_tenant_spend_usd", "USD a tenant has spent this calendar month (UTC)",
                                  ["tenant"], registry=r)
        self.tenant_burn = Gauge("lockstep_tenant_burn_usd_per_hour",
                                 "USD per hour a tenant's billing allocations cost now", ["tenant"], registry=r)
        self.tenant_budget = Gauge("lockstep_tenant_budget_usd", "A tenant's monthly budget, when it has one",
                                   ["tenant"], registry=r)
        self.spikes_open = Gauge("lockstep_price_spikes_open", "Open spot price spike alerts by provider and GPU",
                                 ["provider", "gpu"], registry=r)
        self.spike_ratio = Gauge("lockstep_price_spike_ratio",
                                 "Highest peak / baseline price among the open spike alerts", ["provider", "gpu"],
                                 registry=r)
        self.reconcile_last = Gauge("lockstep_reconcile_last_completed_timestamp_seconds",
                                    "When this replica's last reconciliation completed (Unix time)", registry=r)
        self.reconcile_unreachable = Gauge("lockstep_reconcile_unreachable_providers",
                                           "Providers the last reconciliation could not list", registry=r)

    # ------------------------------------------------------------------ hooks
    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, method, str(status)).inc()
        self.http_seconds.labels(route).observe(seconds)

    def quote_hook(self, chained: Callable[[float], None] | None) -> Callable[[float], None]:
        def observe(seconds: float) -> None:
            self.quote_seconds.observe(seconds)
            if chained is not None:
                chained(seconds)
        return observe

    def refresh_hook(self, chained: RefreshHook | None) -> RefreshHook:
        def observe(provider: str, ok: bool, seconds: float) -> None:
            self.provider_refresh.labels(provider, "ok" if ok else "error").inc()
            if not ok:
                self.provider_errors.labels(provider).inc()
            self.provider_seconds.labels(provider).observe(seconds)
            if chained is not None:
                chained(provider, ok, seconds)
        return observe

    def placement_hook(self, chained: Callable[[str, str], None] | None) -> Callable[[str, str], None]:
        def observe(provider: str, outcome: str) -> None:
            self.placement_attempts.labels(provider, outcome).inc()
            if chained is not None:
                chained(provider, outcome)
        return observe

    # ------------------------------------------------------------------ scrape
    def snapshot(self, svc: Lockstep, now: datetime | None = None) -> dict[str, Any]:
        """What a scrape reports: the service's figures (blocking: run it off the loop)."""
        return svc.metrics_figures(now)

    def render(self, counts: dict[str, Any] | None) -> bytes:
        if counts is not None:
            for state in JobState:
                self.jobs.labels(state.value).set(counts["jobs"].get(state.value, 0))
            self.placements.set(counts["placements"])
            self.allocations.clear()
            for provider, state, n in counts["allocations"]:
                self.allocations.labels(provider, state).set(n)
            self._render_snapshot(counts)
        return generate_latest(self.registry)

    def _render_snapshot(self, snap: dict[str, Any]) -> None:
        for state, age in snap.get("oldest", {}).items():
            self.jobs_oldest.labels(state).set(age)
        for gauge in (self.provider_up, self.provider_offers, self.provider_last_ok, self.circuit_state,
                      self.circuit_failures, self.circuit_next_probe):
            gauge.clear()
        for name, h in snap.get("providers", {}).items():
            self.provider_up.labels(name).set(1 if h.ok and not h.stale else 0)
            self.provider_offers.labels(name).set(h.offers)
            if h.last_ok is not None:
                self.provider_last_ok.labels(name).set(as_utc(h.last_ok).timestamp())
            self.circuit_state.labels(name).set(circuit_code(h.circuit.state))
            self.circuit_failures.labels(name).set(h.circuit.failures)
            if h.circuit.next_probe_at is not None:
                self.circuit_next_probe.labels(name).set(as_utc(h.circuit.next_probe_at).timestamp())
        for gauge in (self.tenant_spend, self.tenant_burn, self.tenant_budget):
            gauge.clear()
        for tenant, spent, burn, budget in snap.get("tenants", []):
            self.tenant_spend.labels(tenant).set(spent)
            self.tenant_burn.labels(tenant).set(burn)
            if budget is not None:
                self.tenant_budget.labels(tenant).set(budget)
        self.spikes_open.clear()
        self.spike_ratio.clear()
        for (provider, gpu), ratios in snap.get("spikes", {}).items():
            self.spikes_open.labels(provider, gpu).set(len(ratios))
            self.spike_ratio.labels(provider, gpu).set(max(ratios))
        reconciled = snap.get("reconciled")
        if reconciled is not None:
            at, report = reconciled
            self.reconcile_last.set(as_utc(at).timestamp())
            self.reconcile_unreachable.set(len(report.unreachable))
