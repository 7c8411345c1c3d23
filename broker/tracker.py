"""The price tracker: poll markets, keep their price history, flag spikes.

One run (:meth:`Tracker.run_once`) does, in order:

1. collect price points from every configured market, by what its provider can do
   (:mod:`providers.capabilities`):
   - one with a spot-price history (``aws``): the history since the newest stored point
     of each region, so nothing is fetched twice and nothing is missed;
   - the others: per-GPU-model summaries of their spot and on-demand offers (min, p10,
     median, count: ``vast``) and the rates of owned and reserved capacity (``slurm``,
     ``reserved``); one that lists its nodes (``slurm``) also GPU utilisation per model
     (see :mod:`broker.price_summaries`);
   a snapshot (the bundled ``catalog``) has no history to track and is skipped;
2. store them (the store keeps change-only, deduplicated history);
3. run the spike rule (:mod:`policies.spikes`) over each series that got new
   points, resuming from the stored history and the open alert; open and close
   alerts in the store, log them, and POST them to ``tracker.webhook_url``;
4. housekeeping, at most hourly: prune points older than ``retention_days``,
   compact points older than ``compact_after_days`` to one per hour per series.

Only one tracker polls at a time: a run holds ``store.leader_lock("lockstep-tracker")``
(a PostgreSQL advisory lock; always granted on SQLite). :meth:`run_forever`
keeps the lock while it leads, so several ``lockstep serve`` replicas poll once
between them, and a ``lockstep prices track --once`` started meanwhile skips.
A failing market, region or webhook is reported and logged; it never stops the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import httpx
from pydantic import BaseModel, Field

from broker.config import Settings
from broker.errors import ProviderError, TransientError
from broker.models import AllocationState, Market, PriceFilter, PricePoint, SeriesKey, as_utc, utcnow
from broker.price_summaries import market_summaries, rate_points, utilisation_points
from broker.store import Store
from broker.store.prices import SERIES_KEYS
from policies.risk import RiskKey, preemption_rates
from policies.spikes import SPIKE_MARKETS, SPIKE_STATS, Spike, SpikeDetector, volatility_per_hour
from providers.base import Provider
from providers.capabilities import HasSpotPriceHistory, ListsNodes, Snapshot
from providers.registry import MARKETS, configured, how_to_enable
from providers.retry import retrying, with_retries

log = logging.getLogger(__name__)

LOCK_NAME = "lockstep-tracker"
WEBHOOK_ATTEMPTS = 3
HOUSEKEEPING_EVERY = timedelta(hours=1)
SERIES_FIELDS = SERIES_KEYS  # the store's definition of a price series



class SourceReport(BaseModel):
    seen: int = 0  # points collected from the market this run
    stored: int = 0  # of those, new to the history (the rest repeated a stored point or price)
    errors: list[str] = Field(default_factory=list)


class TrackReport(BaseModel):
    at: datetime
    leader: bool = True  # False: another tracker holds the lock; nothing was polled
    sources: dict[str, SourceReport] = Field(default_factory=dict)
    spikes_opened: int = 0
    spikes_closed: int = 0
    webhook_failures: int = 0
    pruned: int = 0
    compacted: int = 0
    errors: list[str] = Field(default_factory=list)
    # Markets this run did not poll, and why (not switched on, a snapshot, not asked): a run that stored
    # nothing says so rather than printing an empty table (issue 29).
    skipped: dict[str, str] = Field(default_factory=dict)

    @property
    def seen(self) -> int:
        return sum(s.seen for s in self.sources.values())

    @property
    def stored(self) -> int:
        return sum(s.stored for s in self.sources.values())


def series_dict(key: SeriesKey, gpu: str = "") -> dict[str, str]:
    return {**dict(zip(SERIES_FIELDS, key, strict=True)), "gpu": gpu}


def _alert_key(alert: dict[str, Any]) -> SeriesKey:
    s = alert.get("series") or {}
    provider, market, sku, region, zone, stat = (str(s.get(f, "")) for f in SERIES_FIELDS)
    return provider, market, sku, region, zone, stat


def spot_volatility(store: Store, now: datetime, days: float = 7.0) -> dict[RiskKey, float]:
    """Realised volatility per hour of each spot series over the last ``days``, by (provider, zone, sku)."""
    series: dict[RiskKey, list[tuple[datetime, float]]] = {}
    for p in store.price_history(market=Market.spot, stat="price", since=now - timedelta(days=days)):
        series.setdefault((p.provider, p.zone, p.sku), []).append((as_utc(p.at), p.usd_per_hour))
    return {k: volatility_per_hour(v) for k, v in series.items()}


def load_preemption_rates(store: Store, now: datetime, days: float = 7.0) -> dict[RiskKey, float]:
    """Preemptions per hour per (provider, zone, sku), for ``OfferBook.build(preemption_rates=...)``.

    Observed preemptions of our own spot allocations over their hours, blended with a
    prior that grows with the price volatility of the series (policies.risk). Blocking:
    call it with ``asyncio.to_thread`` from async code.
    """
    # Intents never reached a provider: they count nothing, so they are not read.
    started: list[AllocationState] = [s for s in AllocationState if s is not AllocationState.intent]
    return preemption_rates(store.allocations(states=started), now, volatility=spot_volatility(store, now, days))


class Tracker:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        providers: dict[str, Provider],
        clock: Callable[[], datetime] = utcnow,
        *,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.settings = settings
        self.cfg = settings.tracker
        self.store = store
        self.providers = providers
        self.clock = clock
        self._http = http
        self._last_housekeeping: datetime | None = None
        self.runs = 0  # polls done by this tracker
        self.polled = asyncio.Event()  # set after each poll (lets a supervisor or a test wait for one)
        self.leading = False

    # ------------------------------------------------------------------ entry points

    async def run_once(self) -> TrackReport:
        """One poll, if no other tracker holds the leader lock (then ``leader=False`` and nothing is done)."""
        cm = self.store.leader_lock(LOCK_NAME)
        got = await asyncio.to_thread(cm.__enter__)
        try:
            if not got:
                log.info("tracker: another tracker holds the lock; skipping this run")
                return TrackReport(at=self.clock(), leader=False)
            return await self.poll()
        finally:
            await asyncio.to_thread(cm.__exit__, None, None, None)

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Poll every ``tracker.interval_s`` while leader; otherwise retry for the lock each interval."""
        while not stop.is_set():
            cm: AbstractContextManager[bool] | None = self.store.leader_lock(LOCK_NAME)
            assert cm is not None
            try:
                got = await asyncio.to_thread(cm.__enter__)
            except Exception as exc:  # the database is away: try again next interval
                log.warning("tracker: cannot take the leader lock (%s)", type(exc).__name__)
                got, cm = False, None
            try:
                self.leading = bool(got)
                while got and not stop.is_set():
                    try:
                        await self.poll()
                    except Exception:  # a bug or a dead database must not end the loop
                        log.exception("tracker: run failed")
                    if await self._wait(stop):
                        break
            finally:
                self.leading = False
                if cm is not None:
                    await asyncio.to_thread(cm.__exit__, None, None, None)
            if not got:
                await self._wait(stop)

    async def _wait(self, stop: asyncio.Event) -> bool:
        """Sleep one interval or until ``stop``; True when stopped."""
        try:
            await asyncio.wait_for(stop.wait(), timeout=self.cfg.interval_s)
            return True
        except TimeoutError:
            return False

    # ------------------------------------------------------------------ one poll

    async def poll(self) -> TrackReport:
        """Collect, store, detect, housekeep. Callers hold the leader lock."""
        now = self.clock()
        report = TrackReport(at=now, skipped=self.skipped())
        collected = await self._collect(now, report)
        points = [p for pts in collected.values() for p in pts]
        horizon = now - timedelta(days=self.cfg.retention_days)
        keys = sorted({p.key for p in points})
        before = await asyncio.to_thread(self._latest, keys)
        for source, pts in collected.items():
            # Points older than the retention horizon would be pruned at once: never store them.
            keep = [p for p in pts if as_utc(p.at) >= horizon]
            src = report.sources.setdefault(source, SourceReport())
            try:
                src.stored = await asyncio.to_thread(self.store.add_price_points, keep)
            except Exception as exc:
                self._error(report, source, f"store: {type(exc).__name__}")
        gpus = {p.key: p.gpu for p in points}
        await self._detect(keys, before, gpus, now, report)
        await self._housekeep(now, report)
        self.runs += 1
        self.polled.set()
        log.info(
            "tracker: %d points seen, %d stored, %d spikes opened, %d closed%s",
            report.seen,
            report.stored,
            report.spikes_opened,
            report.spikes_closed,
            f", errors: {'; '.join(report.errors)}" if report.errors else "",
        )
        return report

    def skipped(self) -> dict[str, str]:
        """Every market a poll leaves out, with the reason a user can act on."""
        out: dict[str, str] = {}
        for name in MARKETS:
            provider = self.providers.get(name)
            if isinstance(provider, Snapshot):
                out[name] = "a bundled price snapshot, not a live market: nothing to track (docs/catalog.md)"
            elif provider is None and configured(self.settings, name):
                out[name] = "switched on, but not asked this run (--provider)"
            elif provider is None:
                out[name] = f"not switched on: needs {how_to_enable(name) or MARKETS[name].section + '.enabled: true'}"
        return out

    def _error(self, report: TrackReport, source: str, message: str) -> None:
        report.sources.setdefault(source, SourceReport()).errors.append(message)
        report.errors.append(f"{source}: {message}")
        log.warning("tracker: %s: %s", source, message)

    async def _collect(self, now: datetime, report: TrackReport) -> dict[str, list[PricePoint]]:
        names = [n for n, p in self.providers.items() if not isinstance(p, Snapshot)]
        results = await asyncio.gather(*(self._collect_one(n, now, report) for n in names))
        out = dict(zip(names, results, strict=True))
        for name, pts in out.items():
            report.sources.setdefault(name, SourceReport()).seen = len(pts)
        return out

    async def _collect_one(self, name: str, now: datetime, report: TrackReport) -> list[PricePoint]:
        provider = self.providers[name]
        try:
            if isinstance(provider, HasSpotPriceHistory):
                return await self._history(name, provider, now, report)
            return await asyncio.wait_for(
                self._market(name, provider, now), self.settings.broker.provider_timeout_s
            )
        except Exception as exc:  # one market failing must not cost the others their points
            if not isinstance(exc, ProviderError | TimeoutError | httpx.HTTPError | OSError):
                log.exception("tracker: %s: unexpected failure", name)
            # Provider errors are built from status and error codes (no secrets); others only by type.
            self._error(report, name, str(exc) if isinstance(exc, ProviderError) else type(exc).__name__)
            return []

    async def _history(
        self, name: str, provider: HasSpotPriceHistory, now: datetime, report: TrackReport
    ) -> list[PricePoint]:
        horizon = now - timedelta(days=self.cfg.retention_days)
        since: dict[str, datetime | None] = {}
        for region in await provider.price_regions():
            last = await asyncio.to_thread(self.store.last_seen, provider.name, region)
            since[region] = max(last, horizon) if last is not None else None
        out: list[PricePoint] = []
        results = await provider.spot_price_history(since, now=now)
        for region, res in results.items():
            if isinstance(res, BaseException):
                msg = str(res) if isinstance(res, ProviderError) else f"{region}: {type(res).__name__}"
                self._error(report, name, msg)
            else:
                out.extend(res)
        return out

    async def _market(self, name: str, provider: Provider, now: datetime) -> list[PricePoint]:
        offers = await provider.offers(None)
        points = market_summaries(name, offers, now) + rate_points(name, offers, now)
        if isinstance(provider, ListsNodes):  # a pool of nodes: utilisation per GPU model
            points += utilisation_points(name, provider.pool or name, await provider.list_nodes(), now)
        return points

    # ------------------------------------------------------------------ spikes

    def _latest(self, keys: list[SeriesKey]) -> dict[SeriesKey, datetime | None]:
        watched = [k for k in keys if k[5] in SPIKE_STATS and k[1] in SPIKE_MARKETS]
        latest = self.store.latest_price_points(watched)  # one read for all series, not one per series
        return {k: as_utc(latest[k].at) if k in latest else None for k in watched}

    def _series_points(
        self, key: SeriesKey, since: datetime | None, until: datetime | None, limit: int | None
    ) -> list[tuple[datetime, float]]:
        pts = self.store.price_history(
            PriceFilter.model_validate(
                {**dict(zip(SERIES_FIELDS, key, strict=True)), "since": since, "until": until, "limit": limit})
        )
        return [(as_utc(p.at), p.usd_per_hour) for p in pts]

    def _spike_work(
        self, keys: list[SeriesKey], before: dict[SeriesKey, datetime | None], now: datetime
    ) -> list[tuple[SeriesKey, list[tuple[datetime, float]], SpikeDetector, dict[str, Any] | None]]:
        """Per series with new points: (key, new points, detector resumed from the store, open alert)."""
        alerts = self.store.alerts(since=now - timedelta(days=self.cfg.retention_days))
        by_key: dict[SeriesKey, list[dict[str, Any]]] = {}
        for a in alerts:
            by_key.setdefault(_alert_key(a), []).append(a)
        work = []
        for key in keys:
            if key not in before:
                continue
            prev = before[key]
            new = self._series_points(key, prev + timedelta(microseconds=1) if prev else None, None, None)
            if not new:
                continue
            mine = by_key.get(key, [])
            open_alert = next((a for a in mine if a["end"] is None), None)
            history: list[float] = []
            if prev is not None:
                # The baseline window: the newest points before this run, outside any stored spike.
                older = self._series_points(key, None, prev + timedelta(microseconds=1), self.cfg.window * 4)
                spans = [(as_utc(a["start"]), as_utc(a["end"]) if a["end"] else None) for a in mine]
                history = [
                    price
                    for at, price in older
                    if not any(s <= at and (e is None or at < e) for s, e in spans)
                ][-self.cfg.window :]
            open_spike = None
            if open_alert is not None:
                open_spike = Spike(
                    as_utc(open_alert["start"]), None, float(open_alert["peak"]), float(open_alert["baseline"])
                )
            det = SpikeDetector(
                self.cfg.spike_multiple,
                self.cfg.clear_multiple,
                self.cfg.window,
                history=history,
                open_spike=open_spike,
            )
            work.append((key, new, det, open_alert))
        return work

    async def _detect(
        self,
        keys: list[SeriesKey],
        before: dict[SeriesKey, datetime | None],
        gpus: dict[SeriesKey, str],
        now: datetime,
        report: TrackReport,
    ) -> None:
        try:
            work = await asyncio.to_thread(self._spike_work, keys, before, now)
        except Exception as exc:
            report.errors.append(f"spikes: {type(exc).__name__}")
            log.exception("tracker: spike detection failed")
            return
        events: list[dict[str, Any]] = []
        for key, new, det, open_alert in work:
            for at, price in new:
                det.update(at, price)
            series = series_dict(key, gpus.get(key, ""))
            for spike in det.finish():
                if open_alert is not None and spike.start == as_utc(open_alert["start"]):
                    alert_id = int(open_alert["id"])
                    if spike.end is not None or spike.peak > float(open_alert["peak"]):  # closed, or climbed
                        await asyncio.to_thread(self.store.update_alert, alert_id, peak=spike.peak, end=spike.end)
                    if spike.end is not None:
                        report.spikes_closed += 1
                        events.append(self._event("spike_closed", series, spike, alert_id))
                    continue
                alert_id = await asyncio.to_thread(
                    self.store.add_alert, series, spike.start, spike.peak, spike.baseline
                )
                report.spikes_opened += 1
                events.append(self._event("spike_opened", series, spike, alert_id))
                if spike.end is not None:
                    await asyncio.to_thread(self.store.update_alert, alert_id, end=spike.end)
                    report.spikes_closed += 1
                    events.append(self._event("spike_closed", series, spike, alert_id))
        for ev in events:
            log.warning(
                "price %s: %s %s %s %s/%s: %.4f vs baseline %.4f (%.2f×)",
                ev["event"].replace("_", " "),
                ev["series"]["provider"],
                ev["series"]["market"],
                ev["series"]["sku"],
                ev["series"]["region"],
                ev["series"]["zone"],
                ev["peak"],
                ev["baseline"],
                ev["ratio"],
            )
            if self.cfg.webhook_url and not await self._post(ev):
                report.webhook_failures += 1

    @staticmethod
    def _event(kind: str, series: dict[str, str], spike: Spike, alert_id: int) -> dict[str, Any]:
        return {
            "event": kind,
            "alert_id": alert_id,
            "series": series,
            "start": spike.start.isoformat(),
            "end": spike.end.isoformat() if spike.end else None,
            "peak": spike.peak,
            "baseline": spike.baseline,
            "ratio": round(spike.ratio, 4),
        }

    async def _post(self, event: dict[str, Any]) -> bool:
        """POST one event to the webhook; False (logged) on failure. Transient failures retry briefly."""
        assert self.cfg.webhook_url
        url = self.cfg.webhook_url.get_secret_value()
        client = self._http or httpx.AsyncClient(timeout=10.0)

        async def once() -> bool:
            try:
                resp = await client.post(url, json=event)
            except httpx.TransportError as exc:
                raise TransientError("webhook", f"connection failed ({type(exc).__name__})") from exc
            if resp.status_code >= 500 or resp.status_code == 429:
                raise TransientError("webhook", f"HTTP {resp.status_code}")
            if resp.status_code >= 400:
                log.warning("tracker: webhook refused the event (HTTP %d)", resp.status_code)
                return False
            return True

        try:
            return await with_retries(once, retrying(WEBHOOK_ATTEMPTS, max_wait=2.0))
        except TransientError as exc:
            log.warning("tracker: webhook failed: %s", exc)
            return False
        finally:
            if self._http is None:
                await client.aclose()

    # ------------------------------------------------------------------ housekeeping

    async def _housekeep(self, now: datetime, report: TrackReport) -> None:
        if self._last_housekeeping is not None and now - self._last_housekeeping < HOUSEKEEPING_EVERY:
            return
        try:
            report.pruned = await asyncio.to_thread(
                self.store.prune_prices, now - timedelta(days=self.cfg.retention_days)
            )
            report.compacted = await asyncio.to_thread(
                self.store.compact_prices, now - timedelta(days=self.cfg.compact_after_days), 3600
            )
            self._last_housekeeping = now
        except Exception as exc:
            report.errors.append(f"housekeeping: {type(exc).__name__}")
            log.exception("tracker: housekeeping failed")
