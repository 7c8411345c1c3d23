"""Rendering for the terminal (rich tables) and for scripts (--json)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from broker.models import NO_WORKLOAD_NOTE, Job, Offer, Quote, source_label, utcnow

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_console: Console | None = None


def _get_console() -> Console:
    """rich is imported on the first table, not at start-up: ``--json`` never loads it."""
    global _console
    if _console is None:
        from rich.console import Console

        # Piped output (scripts, CI logs) gets a wide table instead of rich's 80-column default.
        _console = Console(width=None if sys.stdout.isatty() else 200)
    return _console


def _table(**kwargs: Any) -> Table:
    from rich.table import Table

    return Table(**kwargs)


def __getattr__(name: str) -> Any:  # ``render.console`` for the other commands' modules
    if name == "console":
        return _get_console()
    raise AttributeError(name)


def print_json(data: Any) -> None:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    print(json.dumps(data, indent=2, default=str))


def emit(data: Any, json_out: bool, table: Callable[[Any], None]) -> None:
    """The one switch every command makes: JSON for scripts, a table for people."""
    if json_out:
        print_json(data)
    else:
        table(data)


def _money(x: float) -> str:
    return f"${x:,.2f}"


def quote_table(q: Quote, explain: bool = False) -> None:
    spec = q.job
    _get_console().print(
        f"[bold]{spec.name}[/]: {spec.gpus} × {'/'.join(spec.gpu) or 'any GPU'} as {spec.nodes} node(s) × "
        f"{spec.gpus_per_node}, fabric {spec.fabric.value}, co-located at '{spec.colocate.value}'"
        f" — {len(q.options)} option(s) shown of {q.offers_considered} offers"
    )
    t = _table(show_lines=False)
    # The price is the whole allocation's (every node and GPU), not one GPU's: say so in the header.
    alloc = f"$/h (all {spec.gpus} GPUs)"
    for col in ("#", "provider", "market", "sku", "region/zone", "nodes×GPUs", "fabric", alloc, "price from",
                "hours", "job cost"):
        t.add_column(col, justify="right" if col in ("#", alloc, "hours", "job cost") else "left")
    for i, o in enumerate(q.options, 1):
        where = o.region + (f"/{o.zone}" if o.zone else "") + (f" [{o.cluster}]" if o.cluster else "")
        fabric = f"{o.fabric.value} {o.fabric_gbps:g}G" if o.fabric_gbps else o.fabric.value
        t.add_row(str(i), o.provider, o.market.value + (" (stale)" if o.stale else ""), o.sku, where,
                  f"{o.nodes}×{o.gpus_per_node} {o.gpu}", fabric, _money(o.usd_per_hour),
                  o.source_label or o.source.value,
                  "—" if o.expected_hours is None else f"{o.expected_hours:,.1f}",
                  "—" if o.expected_hours is None else _money(o.expected_cost_usd))
    _get_console().print(t)
    snapshot_only = sorted(m for m, by in q.feasible_sources.items() if set(by) == {"snapshot"})
    if snapshot_only:
        _get_console().print(f"{', '.join(snapshot_only)}: prices from the bundled snapshot only, not a live market "
                      "(see `lockstep submit` and docs/catalog.md)")
    for note in q.notes:
        if note == NO_WORKLOAD_NOTE:
            _get_console().print(note)
    if q.options and q.options[0].breakdown and q.options[0].expected_hours is not None:
        b = q.options[0].breakdown
        _get_console().print(
            f"best: compute {b.compute_hours:,.2f} h + communication {b.comm_hours:,.2f} h"
            + (f" + preemption {b.preemption_overhead_hours:,.2f} h" if b.preemption_overhead_hours else "")
            + (f" + queue {b.queue_wait_hours:,.2f} h" if b.queue_wait_hours else "")
            + (f"; egress {_money(b.egress_usd)}" if b.egress_usd else "")
            + ("; " + "; ".join(b.notes) if b.notes else "")
        )
    if q.rejected_counts:
        summary = ", ".join(f"{k}: {v}" for k, v in sorted(q.rejected_counts.items(), key=lambda kv: -kv[1]))
        _get_console().print(f"rejected {sum(q.rejected_counts.values())} offers ({summary})"
                      + ("" if explain else " — use --explain for why"))
    if explain:
        rejected_table(q)


def rejected_table(q: Quote) -> None:
    groups: dict[str, list] = defaultdict(list)
    for r in q.rejected:
        groups[r.code].append(r)
    t = _table(title="rejected offers")
    for col in ("provider", "sku", "region/zone", "reason"):
        t.add_column(col)
    for code in sorted(groups, key=lambda c: -len(groups[c])):
        for r in groups[code]:
            t.add_row(r.provider, r.sku, r.region + (f"/{r.zone}" if r.zone else ""), r.reason)
    _get_console().print(t)


def infeasible_reasons(q: Quote) -> str:
    """One line: why nothing fits, grouped by reason, most common first."""
    groups: dict[str, list[str]] = defaultdict(list)
    for r in q.rejected:
        groups[r.code].append(r.reason)
    # e.g. "no market offers B300": the reason that matters, first
    parts = [n for n in q.notes if n != NO_WORKLOAD_NOTE]
    for code, n in sorted(q.rejected_counts.items(), key=lambda kv: -kv[1]):
        example = groups[code][0] if groups.get(code) else ""
        parts.append(f"{n} × {code}" + (f" (e.g. {example})" if example else ""))
    return "; ".join(parts) or "no offers at all (no provider answered)"


def offers_table(offers: list[Offer]) -> None:
    t = _table()
    for col in ("provider", "market", "sku", "GPU", "GPUs", "mem GB", "fabric", "max nodes", "region/zone",
                "$/h", "$/GPU-h", "price from", "note"):
        t.add_column(col, justify="right" if col in ("GPUs", "mem GB", "$/h", "$/GPU-h", "max nodes") else "left")
    now = utcnow()
    for o in offers:
        note = []
        if o.stale:
            note.append("stale")
        if o.interruptible:
            note.append("interruptible")
        if o.perf is not None:
            note.append(f"{o.perf.source} {o.perf.relative:.2f}×" if o.perf.relative else o.perf.source)
        fabric = f"{o.network.fabric.value} {o.network.fabric_gbps:g}G" if o.network.fabric_gbps else \
            o.network.fabric.value
        t.add_row(o.provider, o.market.value, o.sku, o.gpu, str(o.gpu_count), f"{o.gpu_memory_gb:g}", fabric,
                  str(o.max_nodes), o.locality.region + (f"/{o.locality.zone}" if o.locality.zone else ""),
                  _money(o.usd_per_hour), _money(o.usd_per_gpu_hour), source_label(o.source, o.observed_at, now),
                  ", ".join(note))
    _get_console().print(t)
    _get_console().print(f"{len(offers)} offer(s)")


def spent(j: Job) -> str:
    """What a job has cost: booked, plus what its live allocation has accrued ("…" while it accrues)."""
    total = j.spent_usd + j.accruing_usd
    if not total and not j.accruing_usd:
        return ""
    return f"${total:,.4f}".rstrip("0").rstrip(".") + ("…" if j.accruing_usd else "")


def jobs_table(jobs: list[Job]) -> None:
    t = _table()
    for col in ("id", "tenant", "name", "state", "GPUs", "where", "$/h", "spent", "attempts", "updated", "reason"):
        t.add_column(col)
    for j in jobs:
        p = j.placement
        where = f"{p.provider}:{p.sku}@{p.zone or p.region}" if p else ""
        t.add_row(j.id, j.tenant, j.spec.name, j.state.value, str(j.spec.gpus), where,
                  _money(p.usd_per_hour) if p else "", spent(j), str(j.attempts),
                  j.updated_at.strftime("%Y-%m-%d %H:%M:%S"), j.reason[:60])
    _get_console().print(t)


def job_detail(j: Job) -> None:
    jobs_table([j])
    if j.decision:
        _get_console().print("decision: " + json.dumps(j.decision, default=str))
    t = _table(title="events")
    for col in ("at", "from", "to", "reason"):
        t.add_column(col)
    for e in j.events:
        t.add_row(e.at.strftime("%Y-%m-%d %H:%M:%S"), e.from_state.value if e.from_state else "",
                  e.to_state.value, e.reason)
    _get_console().print(t)
