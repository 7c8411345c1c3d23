"""Prometheus metrics, one CollectorRegistry per application (several apps may share a process).

Counters and histograms are fed by hooks as things happen (HTTP requests,
quotes, provider refreshes); job and placement counts are read from the store
when /metrics is scraped, so every replica reports the same truth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from broker.models import JobState

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

    # ------------------------------------------------------------------ scrape
    def render(self, counts: dict[str, Any] | None) -> bytes:
        if counts is not None:
            for state in JobState:
                self.jobs.labels(state.value).set(counts["jobs"].get(state.value, 0))
            self.placements.set(counts["placements"])
            self.allocations.clear()
            for provider, state, n in counts["allocations"]:
                self.allocations.labels(provider, state).set(n)
        return generate_latest(self.registry)
