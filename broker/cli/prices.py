"""`lockstep prices …`: price history (table, terminal chart, PNG), spike alerts, tracking, replay.

Thin: parse options, call the service (broker/service/prices.py), render.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import local_only, validated, with_service, with_store_or_server
from broker.errors import SpecError
from broker.models import PriceFilter, PriceSeries, SeriesKey, Spike, as_utc, parse_duration, utcnow

if TYPE_CHECKING:
    from broker.sdk import AsyncClient
    from broker.service import Lockstep
    from broker.service.prices import Replay

app = typer.Typer(no_args_is_help=True, help="Spot price tracking: history, alerts, replay.", add_completion=False,
                  pretty_exceptions_enable=False)

CHART_SERIES = 8  # lines in one chart; more becomes unreadable

def parse_since(text: str, now: datetime) -> datetime:
    """'7d', '36h', '90m' back from now, or an ISO date/time; SpecError('since', …) otherwise."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(
            "since", f"not a duration or a date: {text!r} (use e.g. 90m, 36h, 7d or 2026-01-31)"
        ) from None
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at
    if at > now:
        raise SpecError("since", f"{text!r} is in the future")
    return at


def series_label(key: SeriesKey) -> str:
    provider, market, sku, region, zone, stat = key
    where = zone or region
    return (
        f"{provider} {market} {sku}"
        + (f" {where}" if where else "")
        + ("" if stat == "price" else f" [{stat}]")
    )


def _steps(s: PriceSeries, until: datetime) -> tuple[list[datetime], list[float]]:
    """Change-only points as a step line: each price holds until the next point (the last until ``until``)."""
    xs: list[datetime] = []
    ys: list[float] = []
    for i, (at, price) in enumerate(zip(s.at, s.usd_per_hour, strict=True)):
        nxt = s.at[i + 1] if i + 1 < len(s.at) else max(until, at)
        xs += [at, nxt]
        ys += [price, price]
    return xs, ys


def _chart_series(series: list[PriceSeries]) -> list[PriceSeries]:
    # The cheapest series first: what a person shopping for the GPU looks at.
    return sorted(series, key=lambda s: (s.usd_per_hour[-1], series_label(s.key)))[:CHART_SERIES]


def terminal_chart(series: list[PriceSeries], now: datetime, width: int, color: bool = False) -> str:
    import plotext as plt

    fig = plt.figure
    fig.clear()
    plt.terminal.limit(False, False)
    fig.plot_size(max(60, min(width, 160)), 20)
    fig.date("x").activate(form="%m-%d %H:%M")
    for one in _chart_series(series):
        xs, ys = _steps(one, now)
        s = fig.signal([x.replace(tzinfo=None) for x in xs], ys)
        s.lines()
        s.label(series_label(one.key))
        fig.draw(s)
    fig.title("USD per hour (UTC)")
    return str(fig.build().string(colorless=not color))


def write_png(
    path: str,
    series: list[PriceSeries],
    spikes: dict[SeriesKey, list[Spike]],
    now: datetime,
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    # The x values are datetimes, which matplotlib takes through its units machinery (a date axis with
    # its own locator); its type stubs know only floats there (matplotlib issue #25676), hence the
    # arg-type ignores below. Converting to floats (date2num) would lose the date locator.
    top = 0.0
    marked = False
    try:
        for one in _chart_series(series):
            xs, ys = _steps(one, now)
            (line,) = ax.plot(xs, ys, linewidth=1.6, label=series_label(one.key))  # type: ignore[arg-type]
            top = max(top, *ys)
            for sp in spikes.get(one.key, []):
                ax.axvspan(
                    sp.start, sp.end or now,  # type: ignore[arg-type]
                    color="red",
                    alpha=0.12,
                    linewidth=0,
                    label=None if marked else "price spike",
                )
                marked = True
                ax.plot([sp.start], [sp.peak], marker="^", color="red", markersize=8)  # type: ignore[arg-type]
                ax.annotate(
                    f"{sp.ratio:.1f}×",
                    (sp.start, sp.peak),
                    textcoords="offset points",
                    xytext=(4, 6),
                    color="red",
                    fontsize=8,
                )
            ax.plot([xs[-1]], [ys[-1]], marker="o", color=line.get_color(), markersize=3)  # type: ignore[arg-type]
        ax.set_title(title)
        ax.set_ylabel("USD per hour")
        ax.set_xlabel("time (UTC)")
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(mdates.AutoDateLocator()))
        ax.grid(True, alpha=0.3)
        ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)  # room above the peak for its label
        if series:
            ax.legend(loc="upper left", fontsize=8, framealpha=0.85)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


@app.command()
def history(
    ctx: typer.Context,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU model or family, e.g. H100.")] = None,
    since: Annotated[str, typer.Option("--since", help="How far back: 90m, 36h, 7d, or a date.")] = "7d",
    zone: Annotated[str | None, typer.Option("--zone", help="Only this zone.")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="Only this provider.")] = None,
    stat: Annotated[
        str | None,
        typer.Option("--stat", help="price, min, p10, median or utilisation (default: price and median)."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the points as JSON.")] = False,
    png: Annotated[str | None, typer.Option("--png", help="Also write a chart to this PNG file.")] = None,
) -> None:
    """Stored price history: a chart and a table per series (or JSON)."""
    from broker.service.prices import spike_stat_series

    now = utcnow()
    start = parse_since(since, now)
    f = validated(PriceFilter, gpu=gpu, provider=provider, zone=zone, since=start, stat=stat)

    def watched(series: list[PriceSeries]) -> list[PriceSeries]:
        if stat is None:  # by default the stats the spike rule watches: prices and marketplace medians
            series = spike_stat_series(series)
        return series

    async def read(svc: Lockstep) -> tuple[list[PriceSeries], dict[SeriesKey, list[Spike]]]:
        series = watched(await svc.price_series(f))
        return series, svc.spikes(series)

    async def read_remote(remote: AsyncClient) -> tuple[list[PriceSeries], dict[SeriesKey, list[Spike]]]:
        from broker.service.prices import series_spikes

        series = watched(await remote.price_series(f))  # GET /v1/prices/series; spikes by this config's rule
        return series, series_spikes(series, c.settings.tracker)

    c = get_ctx(ctx)
    series, spikes = with_store_or_server(c, read, read_remote)
    if png and series:  # no points, no chart: an empty one would be dated 1970 (issue 29)
        write_png(png, series, spikes, now, f"{gpu or 'all GPUs'}: price since {start:%Y-%m-%d %H:%M} UTC")
    if json_out:
        render.print_json(sorted((p for s in series for p in s.points()), key=lambda p: p.at))
        return
    if not series:
        render.console.print(
            f"no price points since {start:%Y-%m-%d %H:%M} UTC"
            + (f" for {gpu}" if gpu else "")
            + (f", so no chart written to {png}" if png else "")
            + " (`lockstep prices track --once` stores the live markets' prices and says which it could not poll)",
            markup=False, highlight=False,
        )
        return
    try:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")  # lines told apart by colour
        print(terminal_chart(series, now, render.console.width or 100, color=color), flush=True)
    except Exception as exc:  # a chart is a nicety: the table below still answers
        logging.getLogger(__name__).debug("terminal chart failed: %s", exc)
    table = Table(title=f"Prices since {start:%Y-%m-%d %H:%M} UTC")
    for col in ("series", "gpu", "points", "first", "last", "min", "max", "spikes"):
        table.add_column(col, justify="right" if col not in ("series", "gpu") else "left")
    for one in sorted(series, key=lambda s: series_label(s.key)):
        prices = one.usd_per_hour
        table.add_row(
            series_label(one.key),
            one.gpu,
            str(len(prices)),
            f"{prices[0]:.4f}",
            f"{prices[-1]:.4f}",
            f"{min(prices):.4f}",
            f"{max(prices):.4f}",
            str(len(spikes[one.key])) if spikes[one.key] else "",
        )
    render.console.print(table)
    if png:
        render.console.print(f"chart written to {png}")


def _alert_row(a: dict[str, Any]) -> dict[str, Any]:
    s = a.get("series") or {}
    base = float(a["baseline"])
    peak = float(a["peak"])  # the tracker raises it while the spike climbs
    return {
        "id": a["id"],
        "series": s,
        "start": as_utc(a["start"]).isoformat(),
        "end": as_utc(a["end"]).isoformat() if a.get("end") else None,
        "peak": peak,
        "baseline": base,
        "ratio": round(peak / base, 4) if base > 0 else None,
    }


@app.command()
def alerts(
    ctx: typer.Context,
    open_only: Annotated[bool, typer.Option("--open", help="Only spikes still open.")] = False,
    since: Annotated[
        str | None, typer.Option("--since", help="Only alerts active since: 7d, 36h, a date.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print alerts as JSON.")] = False,
) -> None:
    """Price spikes the tracker flagged, newest first."""
    local_only(get_ctx(ctx), "prices alerts")
    start = parse_since(since, utcnow()) if since else None
    rows = [_alert_row(a) for a in with_service(get_ctx(ctx), lambda svc: svc.alerts(open_only, start))]
    if json_out:
        render.print_json(rows)
        return
    if not rows:
        render.console.print("no spike alerts" + (" open" if open_only else ""))
        return
    table = Table(title="Price spikes")
    for col in ("id", "series", "start", "end", "peak", "baseline", "ratio"):
        table.add_column(col, justify="right" if col in ("id", "peak", "baseline", "ratio") else "left")
    for r in rows:
        s = r["series"]
        label = series_label(
            (
                s.get("provider", ""),
                s.get("market", ""),
                s.get("sku", ""),
                s.get("region", ""),
                s.get("zone", ""),
                s.get("stat", "price"),
            )
        )
        table.add_row(
            str(r["id"]),
            label,
            r["start"][:16],
            (r["end"] or "open")[:16],
            f"{r['peak']:.4f}",
            f"{r['baseline']:.4f}",
            f"{r['ratio']:.2f}×" if r["ratio"] else "",
        )
    render.console.print(table)


@app.command()
def track(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="One run, then exit (for cron or a CronJob).")] = False,
    provider: Annotated[list[str] | None, typer.Option("--provider", help="Only these providers.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
) -> None:
    """Poll the markets and store their prices (once, or every tracker.interval_s until interrupted).

    Exit code 1 when every market failed in a --once run.
    """
    from broker.cli.progress import working

    c = get_ctx(ctx)
    local_only(c, "prices track")
    logging.getLogger("broker.tracker").setLevel(logging.INFO)

    async def run(svc: Lockstep) -> Any:
        if once:
            return await svc.track_once()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await svc.track_until(stop)
        return None

    what = ("polling the markets and storing their prices" if once else
            f"tracking prices every {c.settings.tracker.interval_s:g} s (Ctrl-C to stop)")
    with working(what):  # on stderr: the report below (or --json) is all stdout carries
        report = with_service(c, run, markets=True, only=provider)
    if report is None:
        return
    if json_out:
        render.print_json(report.model_dump(mode="json") | {"seen": report.seen, "stored": report.stored})
    else:
        _report_table(report)
    tried = list(report.sources.values())
    if report.leader and tried and all(s.errors and not s.seen for s in tried):
        raise typer.Exit(1)


def _report_table(report: Any) -> None:
    if not report.leader:
        render.console.print("another tracker holds the lock (a `lockstep serve` replica?): nothing polled")
        return
    if report.sources:
        table = Table(title=f"Tracker run at {report.at:%Y-%m-%d %H:%M:%S} UTC")
        for col in ("source", "seen", "stored", "errors"):
            table.add_column(col, justify="right" if col in ("seen", "stored") else "left")
        for name, s in sorted(report.sources.items()):
            table.add_row(name, str(s.seen), str(s.stored), "; ".join(s.errors))
        render.console.print(table)
    else:
        render.console.print(f"Tracker run at {report.at:%Y-%m-%d %H:%M:%S} UTC: no live market to poll, "
                             "nothing stored")
    for name, why in report.skipped.items():
        render.console.print(f"not polled: {name}: {why}", markup=False, highlight=False)
    render.console.print(
        f"spikes opened {report.spikes_opened}, closed {report.spikes_closed}; pruned {report.pruned}, "
        f"compacted {report.compacted}"
        + (f"; webhook failures {report.webhook_failures}" if report.webhook_failures else "")
    )


@app.command("replay")
def replay_cmd(
    ctx: typer.Context,
    file: Annotated[
        str, typer.Argument(help="DescribeSpotPriceHistory JSON, or a TSV of AZ, type, product, price, time.")
    ],
    multiple: Annotated[
        float | None, typer.Option("--multiple", help="Spike threshold (default: tracker.spike_multiple).")
    ] = None,
    clear: Annotated[
        float | None, typer.Option("--clear", help="Clear threshold (default: tracker.clear_multiple).")
    ] = None,
    window: Annotated[
        int | None, typer.Option("--window", min=1, help="Baseline points (default: tracker.window).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the spikes as a JSON list.")] = False,
) -> None:
    """Replay recorded spot prices through the spike rule and print the spikes it flags."""
    async def run(svc: Lockstep) -> Replay:
        return svc.replay(file, multiple, clear, window)

    result = with_service(get_ctx(ctx), run)
    records, spikes = result.records, result.spikes
    if json_out:
        render.print_json(spikes)
        return
    series = {(r.zone, r.sku, r.product) for r in records}
    render.console.print(
        f"{len(records)} records, {len(series)} series; rule: price > {result.multiple:g}× trailing median "
        f"of {result.window} points, clears below {result.clear:g}×"
    )
    if not spikes:
        render.console.print("no spikes flagged")
        return
    table = Table(title="Spikes")
    for col in ("zone", "type", "product", "start", "end", "peak", "baseline", "ratio"):
        table.add_column(col, justify="right" if col in ("peak", "baseline", "ratio") else "left")
    for s in spikes:
        table.add_row(
            s["series"]["zone"],
            s["series"]["sku"],
            s["series"]["product"],
            s["start"][:19],
            (s["end"] or "open")[:19],
            f"{s['peak']:.4f}",
            f"{s['baseline']:.4f}",
            f"{s['ratio']:.2f}×",
        )
    render.console.print(table)


__all__ = ["app", "parse_since"]
